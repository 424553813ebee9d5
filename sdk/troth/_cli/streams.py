"""Ctrl-C for the `troth` command: streams (`watch`, `approvals watch`, `promises
watch`) end at once, however busy the machine is, with status 130 and no traceback.

Why a stream did not always end: Python runs a signal handler in the main thread
between bytecodes, so the old handler's `KeyboardInterrupt` surfaced at whatever
point of gRPC's iterator the main thread was in (its waits, its locks, its
cleanup), and on a loaded machine the command was once seen alive 10 s after
SIGINT. Now:

- A stream is read on a daemon thread (`follow`); the main thread waits on a
  C-level queue in short slices. The handler only records the interrupt while a
  stream is followed (no exception thrown into gRPC's code, no lock taken), and
  the main thread, between two slices, cancels the stream and ends the command.
- Whatever the main thread is doing, the C-level signal handler also writes to a
  wakeup pipe (`signal.set_wakeup_fd`), and a watchdog thread reading it ends the
  process `CLEANUP_SECONDS` after the first Ctrl-C (flushing what was printed);
  a second Ctrl-C ends it at once.
- Outside a stream (a one-shot call), Ctrl-C raises `KeyboardInterrupt` as before.
- A command that installs a SIGINT handler of its own (a worker) keeps its
  meaning of Ctrl-C: the watchdog acts only while this module's handler is the
  installed one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import TypeVar

__all__ = ["CLEANUP_SECONDS", "INTERRUPTED", "Interrupts", "follow"]

INTERRUPTED = 130
"""The exit status after Ctrl-C (SIGINT), as shells report it."""

CLEANUP_SECONDS = 2.0
"""How long an interrupted command may take to close its streams and channel."""

POLL_SECONDS = 0.1
"""How often the main thread, waiting for a stream's next item, looks for Ctrl-C."""

T = TypeVar("T")


def _flush_and_exit(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


class Interrupts:
    """SIGINT while a command runs: install in the main thread, `uninstall` after."""

    def __init__(self) -> None:
        self.at: float | None = None
        """When the first Ctrl-C came (monotonic), or None."""
        self.following = False
        """Whether the main thread is in `follow`, which looks at `at` itself."""
        self._previous_handler: signal.Handlers | Callable[..., object] | int | None = None
        self._previous_fd = -1
        self._pipe: tuple[int, int] | None = None

    def install(self) -> None:
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._previous_handler = signal.signal(signal.SIGINT, self._handler)
        threading.Thread(
            target=self._exit_after_grace, args=(read,), name="troth-ctrl-c", daemon=True
        ).start()
        global _installed
        _installed = self

    def uninstall(self) -> None:
        global _installed
        _installed = None
        signal.signal(signal.SIGINT, self._previous_handler)
        signal.set_wakeup_fd(self._previous_fd)
        if self._pipe is not None:
            os.close(self._pipe[1])  # the watchdog reads end-of-file and ends
            self._pipe = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.at is not None:  # the second Ctrl-C: stop now
            _flush_and_exit(INTERRUPTED)
        self.at = time.monotonic()
        if not self.following:
            raise KeyboardInterrupt

    def _exit_after_grace(self, read: int) -> None:
        """The watchdog: the C-level handler writes each signal's number to the pipe,
        even while the main thread cannot run Python code."""
        try:
            while True:
                got = os.read(read, 64)
                if not got:
                    return  # uninstalled: the command ended by itself
                # A command that handles Ctrl-C itself (a worker run from the command
                # line installs its own handler) is left to it.
                if signal.SIGINT in got and signal.getsignal(signal.SIGINT) == self._handler:
                    break
            time.sleep(CLEANUP_SECONDS)
            _flush_and_exit(INTERRUPTED)
        finally:
            with contextlib.suppress(OSError):
                os.close(read)


_installed: Interrupts | None = None
"""The command's `Interrupts`, while installed (main thread only)."""

_ITEM, _END, _ERROR = range(3)


def follow(items: Iterable[T], close: Callable[[], None]) -> Iterator[T]:
    """Yield `items` (a stream that may block for ever), read on a daemon thread.

    On Ctrl-C (with `Interrupts` installed) the stream is closed with `close()` (which
    must make the reading thread's iteration end: cancel the stream, close the
    channel) and `KeyboardInterrupt` is raised here, in this function's own code.
    An error of the stream is raised here too. `close()` is also called when the
    caller stops early."""
    inbox: queue.SimpleQueue[tuple[int, object]] = queue.SimpleQueue()

    def pump() -> None:
        try:
            for item in items:
                inbox.put((_ITEM, item))
        except BaseException as exc:
            inbox.put((_ERROR, exc))
        else:
            inbox.put((_END, None))

    threading.Thread(target=pump, name="troth-stream", daemon=True).start()
    interrupts = _installed
    if interrupts is not None:
        interrupts.following = True
    try:
        while interrupts is None or interrupts.at is None:
            try:
                kind, value = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if kind == _END:
                return
            if kind == _ERROR:
                assert isinstance(value, BaseException)
                raise value
            yield value  # type: ignore[misc]
        raise KeyboardInterrupt
    finally:
        if interrupts is not None:
            interrupts.following = False
        close()
