"""structlog configuration: the only place the server configures logging."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog


def configure(level: str = "info", fmt: str = "auto") -> None:
    """JSON lines off a terminal, readable colourless-safe console lines on one."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; use auto, json or console")
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    # orjson renders bytes straight to a BytesLogger: the structlog docs' fastest path,
    # which matters here because every RPC and every state change logs a line.
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=orjson.dumps)
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    factory: structlog.typing.WrappedLogger = (
        structlog.BytesLoggerFactory(sys.stderr.buffer)
        if as_json
        else structlog.PrintLoggerFactory(sys.stderr)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
