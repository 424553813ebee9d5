"""Schema checks off the writer and off the event loop (DESIGN §4 rule 14).

A promise's schema is checked when it is created, and a resolve value against
the stored schema, on a small pool of threads owned here: never on the group
commit's writer thread (which would stall every write), nor on the grpc.aio
event loop (which would stall every call, the health check included). Each
check is bounded (`domain.schema`, `SchemaBounds`), and the pool is small, so
however many hostile checks arrive at once they hold at most `workers`
threads and take their turn for the interpreter with everyone else.

The writer only compares the schema it sees with the one a value was checked
against (`SettleRequest.checked_schema`); when they differ (the promise was
created meanwhile), it refuses with `ValueNotChecked`, and `settle_checked`
checks the value against that schema here and sends the settle again.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from troth_server.domain import schema as schemas
from troth_server.domain.errors import ValueNotChecked
from troth_server.domain.promise import PromiseState, SettleRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from troth_server.domain.promise import Payload, Promise
    from troth_server.domain.schema import SchemaBounds

R = TypeVar("R")

_ATTEMPTS = 3
"""Schemas never change once created: a settle meets at most one it was not checked
against (the promise appeared after the check read it); the third is a bug."""


class SchemaChecks:
    """Owns the check threads; `stop()` ends them (queued checks are dropped)."""

    def __init__(self, bounds: SchemaBounds | None = None, workers: int = 2) -> None:
        self.bounds = bounds or schemas.DEFAULT_BOUNDS
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="troth-check")

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- from a thread (not the writer): checked in place -----------------------------

    def schema(self, text: str) -> None:
        schemas.check_schema(text, self.bounds)

    def value(self, schema: str, value: Payload) -> None:
        schemas.check_value(schema, value, self.bounds)

    # -- from the event loop: checked on the pool ---------------------------------------

    async def schema_async(self, text: str) -> None:
        if schemas.is_known(text, self.bounds):
            return  # checked before: a cache lookup, no hop needed
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, schemas.check_schema, text, self.bounds)

    async def value_async(self, schema: str, value: Payload) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, schemas.check_value, schema, value, self.bounds)

    # -- a settle, checked before it is written ------------------------------------------

    def precheck(self, request: SettleRequest, found: Promise | None) -> SettleRequest:
        """`request`, its value checked against `found`'s schema if it needs one."""
        schema = _schema_to_check(request, found)
        if schema is None:
            return request
        self.value(schema, request.value)
        return replace(request, checked_schema=schema)

    async def precheck_async(self, request: SettleRequest, found: Promise | None) -> SettleRequest:
        schema = _schema_to_check(request, found)
        if schema is None:
            return request
        await self.value_async(schema, request.value)
        return replace(request, checked_schema=schema)

    def settle_checked(self, request: SettleRequest, write: Callable[[SettleRequest], R]) -> R:
        """`write(request)`, checking the value again against the schema the writer saw
        whenever it was not the one checked."""
        for _ in range(_ATTEMPTS - 1):
            try:
                return write(request)
            except ValueNotChecked as missed:
                self.value(missed.schema, request.value)
                request = replace(request, checked_schema=missed.schema)
        return write(request)

    async def settle_checked_async(
        self, request: SettleRequest, write: Callable[[SettleRequest], Awaitable[R]]
    ) -> R:
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
