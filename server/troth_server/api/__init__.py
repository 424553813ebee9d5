"""gRPC servicers: validate, convert, call the service, map errors in one place."""

from __future__ import annotations
