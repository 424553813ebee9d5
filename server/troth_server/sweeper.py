"""Expires overdue promises in batches, so watchers and the store catch up with time.

Readers never depend on it (reads apply expiry themselves); it makes the
stored state and `WatchPromise` streams follow within one interval.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from troth_server.store import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.service import PromiseService

log = structlog.get_logger("troth.sweeper")


@dataclass(frozen=True, slots=True)
class SweepCounts:
    expired: int
    """Promises this pass settled by expiry."""
    batches: int
    """Write transactions it took (none when nothing was overdue)."""


class Sweeper:
    def __init__(
        self,
        service: PromiseService,
        *,
        interval: float,
        batch_size: int,
        on_tick: Callable[[], None] | None = None,
        others_waiting: Callable[[], bool] = lambda: False,
        on_store_error: Callable[[], None] = lambda: None,
    ) -> None:
        if interval <= 0 or batch_size <= 0:
            raise ValueError("sweeper interval and batch size must be positive")
        self._service = service
        self._interval = interval
        self._batch_size = batch_size
        self._on_tick = on_tick
        """More periodic work on the same beat (task leases, the dispatch fallback)."""
        self._others_waiting = others_waiting
        """Whether requests wait for the writer: a long sweep then takes turns with them."""
        self._on_store_error = on_store_error
        """A pass failed to reach the store (the outage guard hears of it)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="troth-sweeper", daemon=True)
        self.swept = threading.Event()
        """Set after every pass; tests wait on it instead of sleeping."""

    def run_once(self, now: int | None = None) -> SweepCounts:
        """Expire everything overdue at `now` (default: the clock), a batch per transaction."""
        expired = batches = 0
        while True:
            started = time.monotonic()
            n = self._service.expire_overdue(self._batch_size, now)
            if n:
                batches += 1
                expired += n
            if n < self._batch_size:
                break
            if self._others_waiting():
                # A mass expiry (a deadline thousands of promises share) must not
                # starve the requests queued behind it on the one writer: after
                # each full batch, give them as long as the batch took.
                self._stop.wait(time.monotonic() - started)
        if expired:
            log.info("sweeper.expired", expired=expired, batches=batches)
        return SweepCounts(expired=expired, batches=batches)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.run_once()
                if self._on_tick is not None:
                    self._on_tick()
            except StoreError as exc:
                self._on_store_error()
                log.warning("sweeper.store_unavailable", error=str(exc))
            except Exception:
                log.exception("sweeper.failed")
            self.swept.set()
