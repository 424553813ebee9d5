"""What `Worker.run()` adds for a process the worker owns: log output when none is
configured, and Ctrl-C (SIGINT, and SIGTERM) that says what it waits for.

The first signal asks for a graceful stop: `run()` then says which tasks it waits
for and for how long at most. A second one stops at once: the held tasks are
given back (ReleaseTask) without waiting for their steps, and if a step function
is still running the process exits (status 130) rather than wait for it (its
step runs again elsewhere: steps are at least once). No traceback either way.

The signal handler only counts (no lock, no I/O: it runs between two bytecodes
of the main thread, which may hold any lock); `run()` says what the first
means, and `Interrupts.watch`, on a thread of its own, what the second means,
and exits if giving the tasks back hangs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self

from troth._durations import format_duration

if TYPE_CHECKING:
    from types import FrameType, TracebackType

__all__ = [
    "HURRY_SECONDS",
    "INTERRUPTED",
    "LOG_FORMAT",
    "Interrupts",
    "describe_wait",
    "exit_now",
    "show_logs",
]

INTERRUPTED = 130
"""The exit status after a second Ctrl-C, as shells report SIGINT."""

HURRY_SECONDS = 5.0
"""After the second signal: how long giving the tasks back may take before the process exits."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The lines `show_logs` and `troth worker` write."""
_log = logging.getLogger("troth.worker")


def show_logs() -> None:
    """Send troth's INFO lines to stderr, unless the program configured logging itself
    (a handler on the root logger or on `troth`): a plain script then sees what its
    worker does, and one that configures logging is left as it is."""
    troth_logger = logging.getLogger("troth")
    if logging.getLogger().handlers or troth_logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    troth_logger.addHandler(handler)
    if troth_logger.level == logging.NOTSET:
        troth_logger.setLevel(logging.INFO)


class Interrupts:
    """SIGINT and SIGTERM while `Worker.run()` blocks, in the main thread only (elsewhere
    signals are left alone and `count` stays 0)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.count = 0
        self.name = ""
        self._previous: dict[signal.Signals, Any] = {}
        self._done = threading.Event()

    @property
    def now(self) -> bool:
        """A second signal came: stop without waiting for running steps."""
        return self.count >= 2

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if not self.name:
            self.name = signal.Signals(signum).name

    def say_stopping(self, running: list[str], grace: float) -> None:
        """After the first signal (from `run()`'s thread, not the handler): what the
        graceful stop waits for (`running`: the roots of the tasks held)."""
        roots = sorted(set(running))
        again = "; press Ctrl-C again to stop at once (the tasks are given back without waiting)"
        _log.info(
            "worker %s got %s: %s%s",
            self.worker_id, self.name, describe_wait(roots, grace), again if roots else "",
            extra={"worker_id": self.worker_id},
        )  # fmt: skip

    def watch(self) -> None:
        """On a thread of its own: after a second signal, say that the worker stops now,
        and if `run()` has not returned within `HURRY_SECONDS`, exit."""

        def loop() -> None:
            while not self.now:
                if self._done.wait(0.05):
                    return
            # No count here: the stop may be giving them back already (it says how many).
            _log.warning(
                "worker %s got a second signal: stopping now, giving the held tasks back "
                "without waiting for their steps",
                self.worker_id,
                extra={"worker_id": self.worker_id},
            )
            if not self._done.wait(HURRY_SECONDS):
                _log.warning(
                    "worker %s: giving the tasks back took over %s; exiting now",
                    self.worker_id,
                    format_duration(timedelta(seconds=HURRY_SECONDS)),
                )
                exit_now()

        threading.Thread(target=loop, name="troth-interrupts", daemon=True).start()


def exit_now() -> None:
    """End the process at once (status 130), flushing what was logged and printed; a
    step function still running on a pool thread would otherwise hold the exit."""
    for handler in logging.getLogger("troth").handlers + logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(INTERRUPTED)


def describe_wait(roots: list[str], grace: float) -> str:
    """What a graceful stop waits for, in words."""
    if not roots:
        return "no task is running; stopping"
    return (
        f"waiting up to {format_duration(timedelta(seconds=grace))} for {len(roots)} running "
        f"task(s) (workflows {_listed(roots)}) to reach their next step boundary, then giving "
        "them back to the group"
    )


def _listed(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
