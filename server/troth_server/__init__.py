"""troth-server: the durable-promise gRPC server (`troth serve`)."""

from __future__ import annotations

__version__ = "0.1.0"
