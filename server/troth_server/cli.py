"""Entry points the `troth` command delegates to (`troth serve`)."""

from __future__ import annotations

from troth_server.app import serve

__all__ = ["serve"]
