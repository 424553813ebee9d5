"""Schema checks off the writer, off the event loop and off the server's interpreter
(DESIGN §4 rule 14).

A promise's schema is checked when it is created, and a resolve value against
the stored schema, in a small pool of worker processes owned here, running at a
lower CPU priority: never on the group commit's writer thread (which would
stall every write), nor on the grpc.aio event loop (which would stall every
call, the health check included), nor on another thread of the server: a check
is pure Python and holds the interpreter lock, and two such threads made every
write of the server wait its turn for the lock, 5 ms at a time, for whole
seconds (measured: bench/README.md, "Schema checks"). Each check is bounded
(`domain.schema`, `SchemaBounds`), so a hostile one ends in seconds; the pool
is small, so however many arrive at once they cost at most `workers` cores, at a
priority below the server's.

The writer only compares the schema it sees with the one a value was checked
against (`SettleRequest.checked_schema`); when they differ (the promise was
created meanwhile), it refuses with `ValueNotChecked`, and `settle_checked_async`
checks the value against that schema here and sends the settle again.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from troth_server.domain import schema as schemas
from troth_server.domain.errors import InvalidArgument, ValueNotChecked
from troth_server.domain.promise import Payload, PromiseState, SettleRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping
    from concurrent.futures import Future

    from troth_server.domain.promise import Promise
    from troth_server.domain.schema import SchemaBounds

R = TypeVar("R")

_ATTEMPTS = 3
"""Schemas never change once created: a settle meets at most one it was not checked
against (the promise appeared after the check read it); the third is a bug."""

_NICE = 5
"""Worker processes run below the server's priority: the OS, not the interpreter
lock, shares the CPU, and it gives the server's calls the CPU first (nice 5 weighs
about a third of nice 0). Not lower: beside other programs at nice 0 (two CPU hogs
on two cores, a test suite) a check's share of a core shrinks with its weight; at
nice 19 one bounded check got about 1.5 % and ran past its caller's 60 s deadline,
at nice 10 four queued worst checks took up to 46 s, at nice 5 up to 21 s, with the
server's p99 under the attack still 18-39 ms (tests/integration/test_hostile_isolation)."""

_PARENT_POLL_S = 1.0
_PR_SET_PDEATHSIG = 1

Refusal = tuple[str, str] | None
"""What a check in a worker answers: None (fine), or (field, message) to refuse."""


def _worker_start(server_pid: int) -> None:
    os.nice(_NICE)
    # The server handles SIGINT/SIGTERM and shuts the pool down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    # The server may have died while this worker started (before the signal was set).
    threading.Thread(target=_exit_with, args=(server_pid,), daemon=True).start()


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the server dies (even by SIGKILL).
    `start()` creates the workers from the server's main thread, which lives as
    long as the server (the signal follows the creating thread)."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the watchdog below does it
        pass


def _exit_with(parent: int) -> None:
    """A server killed with SIGKILL cannot stop its pool: its workers end on their own."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(0)


def _refusal(exc: InvalidArgument) -> Refusal:
    return exc.field, exc.message.removeprefix(f"{exc.field}: ")


def _check_schema(text: str, bounds: SchemaBounds) -> Refusal:
    try:
        schemas.check_schema(text, bounds)
    except InvalidArgument as exc:
        return _refusal(exc)
    return None


def _check_value(
    schema: str, headers: Mapping[str, str], data: bytes, bounds: SchemaBounds
) -> Refusal:
    try:
        schemas.check_value(schema, Payload(headers, data), bounds)
    except InvalidArgument as exc:
        return _refusal(exc)
    return None


class SchemaChecks:
    """Owns the check processes (started on first use); `stop()` ends them."""

    def __init__(self, bounds: SchemaBounds | None = None, workers: int = 2) -> None:
        self.bounds = bounds or schemas.DEFAULT_BOUNDS
        self._workers = workers
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._known: OrderedDict[str, None] = OrderedDict()
        """Schema texts checked and accepted lately: a repeat needs no check."""

    def start(self) -> None:
        """Start every worker process now (from this thread), not on the first checks."""
        for _ in range(self._workers):
            self._submit(_check_schema, "{}", self.bounds)

    def stop(self) -> None:
        """End the check processes now. They are killed, not asked: they hold nothing
        but a check in progress (whose caller is shutting down too), and at a low priority
        on a busy machine (CPU hogs beside it) asking took them seconds to act on."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((pool._processes or {}).values())  # the pool's own table
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()
        for process in processes:
            process.join()

    def _submit(self, fn: Callable[..., Refusal], *args: object) -> Future[Refusal]:
        with self._lock:
            if self._pool is None:
                # spawn: the server has threads (gRPC's among them), which fork copies badly.
                self._pool = ProcessPoolExecutor(
                    self._workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_worker_start,
                    initargs=(os.getpid(),),
                )
            return self._pool.submit(fn, *args)

    def _broken(self, pool_error: BrokenProcessPool) -> InvalidArgument:
        with self._lock:
            self._pool = None  # the next check starts a fresh pool
        return InvalidArgument(
            "value",
            f"cannot be checked: the check process ended ({pool_error}); it may have run "
            "out of memory on this value; send a smaller value or simplify the schema",
        )

    @staticmethod
    def _answer(refusal: Refusal) -> None:
        if refusal is not None:
            raise InvalidArgument(*refusal)

    def _accepted(self, text: str) -> None:
        with self._lock:
            self._known[text] = None
            self._known.move_to_end(text)
            while len(self._known) > 256:
                self._known.popitem(last=False)

    def _is_known(self, text: str) -> bool:
        with self._lock:
            return text in self._known

    # -- from a thread (not the writer): waits for the check ---------------------------

    def schema(self, text: str) -> None:
        if self._is_known(text):
            return
        try:
            self._answer(self._submit(_check_schema, text, self.bounds).result())
        except BrokenProcessPool as exc:
            raise self._broken(exc) from None
        self._accepted(text)

    def value(self, schema: str, value: Payload) -> None:
        future = self._submit(_check_value, schema, dict(value.headers), value.data, self.bounds)
        try:
            self._answer(future.result())
        except BrokenProcessPool as exc:
            raise self._broken(exc) from None

    # -- from the event loop: awaits the check -------------------------------------------

    async def schema_async(self, text: str) -> None:
        if self._is_known(text):
            return  # checked before: no check needed
        try:
            self._answer(await asyncio.wrap_future(self._submit(_check_schema, text, self.bounds)))
        except BrokenProcessPool as exc:
            raise self._broken(exc) from None
        self._accepted(text)

    async def value_async(self, schema: str, value: Payload) -> None:
        future = self._submit(_check_value, schema, dict(value.headers), value.data, self.bounds)
        try:
            self._answer(await asyncio.wrap_future(future))
        except BrokenProcessPool as exc:
            raise self._broken(exc) from None

    # -- a settle, checked before it is written ------------------------------------------

    async def precheck_async(self, request: SettleRequest, found: Promise | None) -> SettleRequest:
        """`request`, its value checked against `found`'s schema if it needs one."""
        schema = _schema_to_check(request, found)
        if schema is None:
            return request
        await self.value_async(schema, request.value)
        return replace(request, checked_schema=schema)

    async def settle_checked_async(
        self, request: SettleRequest, write: Callable[[SettleRequest], Awaitable[R]]
    ) -> R:
        """`await write(request)`, checking the value again against the schema the writer
        saw whenever it was not the one checked."""
        for _ in range(_ATTEMPTS - 1):
            try:
                return await write(request)
            except ValueNotChecked as missed:
                await self.value_async(missed.schema, request.value)
                request = replace(request, checked_schema=missed.schema)
        return await write(request)


def _schema_to_check(request: SettleRequest, found: Promise | None) -> str | None:
    """The schema a resolve's value must be checked against before the write (None:
    none, or the write will not apply it: another state, or already settled)."""
    if request.state is not PromiseState.RESOLVED or found is None or found.schema is None:
        return None
    if found.is_settled or found.schema == request.checked_schema:
        return None
    return found.schema
