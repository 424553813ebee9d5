"""structlog configuration: the only place the server configures logging."""

from __future__ import annotations

import atexit
import io
import logging
import os
import sys
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import orjson
import structlog

FLUSH_INTERVAL_S = 0.2


class _BufferedWriter:
    """Log lines into a buffer flushed every FLUSH_INTERVAL_S, at exit and on `flush()`.

    Every RPC and every state change writes a line; one write(2) per line cost
    more than the rest of the line's work. A SIGKILL may lose the last 0.2 s of
    log lines, never a write: the database, not the log, is the record.
    """

    def __init__(self, fd: int) -> None:
        self._file = io.BufferedWriter(io.FileIO(fd, "wb", closefd=False), buffer_size=1 << 16)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="troth-log-flush", daemon=True).start()
        atexit.register(self.flush)

    def msg(self, message: bytes) -> None:
        with self._lock:
            self._file.write(message + b"\n")

    log = debug = info = warn = warning = msg
    err = error = critical = exception = failure = fatal = msg

    def flush(self) -> None:
        with self._lock:
            try:
                self._file.flush()
            except (OSError, ValueError):  # stderr closed: nothing more to do
                pass

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL_S):
            self.flush()


_writer: _BufferedWriter | None = None


class _IsoTimestamp:
    """`timestamp` in ISO 8601 UTC with milliseconds; the seconds part is formatted
    once per second rather than once per line (structlog's TimeStamper showed up in
    profiles of the hot path)."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(
        self, _logger: Any, _name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        event["timestamp"] = f"{self._prefix}.{int((now - second) * 1000):03d}Z"
        return event


class _Which:
    """`process` and `pid` on every line: which of several server processes logged it."""

    def __init__(self, process: int | str) -> None:
        self._process = process

    def __call__(
        self, _logger: Any, _name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event["process"] = self._process
        event["pid"] = os.getpid()
        return event


def flush() -> None:
    """Write out buffered log lines now (before exit, or before a signal-driven report)."""
    if _writer is not None:
        _writer.flush()


def configure(level: str = "info", fmt: str = "auto", process: int | str | None = None) -> None:
    """JSON lines off a terminal (buffered), readable console lines on one (unbuffered).
    `process`: which of several server processes this is (`troth serve --processes`),
    logged with its pid on every line."""
    global _writer
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; use auto, json or console")
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    if as_json:
        if _writer is None:
            _writer = _BufferedWriter(sys.stderr.fileno())
        writer = _writer
        # orjson renders bytes straight to the buffer: the structlog docs' fastest path.
        renderer: structlog.typing.Processor = structlog.processors.JSONRenderer(
            serializer=orjson.dumps
        )

        def factory(*_args: Any) -> Any:
            return writer

    else:
        # Fields in the order logged: the first line reads grpc=, console=, metrics= first.
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), sort_keys=False)
        factory = structlog.PrintLoggerFactory(sys.stderr)
    which: list[structlog.typing.Processor] = [] if process is None else [_Which(process)]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *which,
            _IsoTimestamp(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
