"""Credential verification on a small bounded pool of its own (issue 26, part 6).

A token-file token the server has not seen costs one scrypt (16 MiB, tens of
milliseconds of a core) before it can be accepted or refused, and anyone who
knows a key id (the public first part of every token) can send it with a fresh
random secret each time. So the slow path runs here, apart from everything else:

- on `workers` threads of this pool's own (one on a 2-core machine, two from
  4 cores), at a lower CPU priority than the server's, never on the event loop
  and never on its default executor, which SearchPromises, SearchTasks,
  MintSettleToken, PrunePromises and the approver prechecks use: however many
  bad secrets arrive, those calls do not queue behind them;
- bounded: at most `max_waiting` verifications wait for a thread, and at most
  `max_per_key` per key id of the token file are running or waiting (JWTs, a
  signature check each, only by the waiting room),
  so a flood on one key id leaves room for the others; and a key id starts at
  most `per_key_rate` verifications a second (bursts of `per_key_burst`), so a
  flood on one key id costs a fraction of a core, not a whole one. A key id's
  holder needs one verification per reload of the token file (then it is
  cached), so only wrong secrets ever meet that rate. Past a bound a new
  verification is refused at once, RESOURCE_EXHAUSTED with reason OVERLOADED
  and a RetryInfo delay (`VerificationsBusy`, DESIGN §4 rule 14), costing the
  server a dict lookup;
- the same token asked for twice at once is verified once (both callers wait
  for the one answer: a fleet of workers sharing a token, restarting together);
- a refused credential (a wrong secret, an unknown key id, a bad JWT) and a
  refusal at a key id's own bounds (which only wrong secrets reach) are answered
  `refusal_delay_s` late: a loop sending bad secrets without backoff is slowed to
  two calls a second, for the price of a timer. The bound of the waiting room,
  which a new honest credential may meet, is answered at once.

What never comes here: a token verified before (the `Authenticator`'s cache of
verified credentials; a legitimate holder of a flooded key id is served from it
and never waits), a key id the token file does not hold, and a token refused
lately (`TokenTable`'s per-key-id cache of refused digests): `Authenticator.cached`
answers or refuses those on the event loop, with one SHA-256.

Use: `principal = await pool.verify(token)` where the server would have called
`Authenticator.cached` then `Authenticator.verify`; `stop()` when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troth_server.auth._errors import AuthError, Unauthenticated
from troth_server.auth._tokens import TOKEN_PREFIX, split_token, token_digest
from troth_server.domain.errors import DomainError, Overloaded

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.auth._authenticator import Authenticator
    from troth_server.domain.access import Principal

WORKERS = max(1, min(2, (os.cpu_count() or 1) // 2))
"""Threads verifying at once: half the cores, one or two. A scrypt takes a core while
it runs (it does not hold the interpreter lock): this is what a flood can take."""
MAX_WAITING = 16
"""Verifications waiting for a thread, all key ids together (about 16 x 50 ms of scrypt)."""
MAX_PER_KEY = 4
"""Verifications running or waiting for one key id (all JWTs share one)."""
PER_KEY_RATE = 1.0
"""Verifications a key id of the token file may start per second, on average (JWTs,
cheap to check and each one distinct, are not limited so)."""
PER_KEY_BURST = 2
"""... and at once, after a quiet while."""
RETRY_AFTER_MS = 250
"""The delay a refusal's RetryInfo asks for: a few verifications' time."""
REFUSAL_DELAY_S = 0.5
"""How late a refused credential is answered: what bad credentials cost their sender."""
NICE = 5
"""The pool's threads run this much below the server's priority (as the schema checks'
processes do, checks.py): when the cores are busy the OS serves the server's calls first."""
LIMIT = "auth-verifications"
"""The `limit` of a refusal's ErrorInfo metadata (no flag sets it)."""
JWT_KEY = "jwt"
"""The key every JWT is counted under (a JWT's own key id is the sender's to choose)."""


class VerificationsBusy(Overloaded, AuthError):
    """A new credential that could not be verified now: the pool is at a bound, or the
    server is stopping. RESOURCE_EXHAUSTED, reason OVERLOADED, with a RetryInfo delay;
    an `AuthError` too, so that it is audited (`auth.refused`) like the other refusals
    of authentication."""

    def __init__(
        self,
        what: str,
        retry_after_ms: int = RETRY_AFTER_MS,
        *,
        one_key: bool = False,
        **metadata: str,
    ) -> None:
        DomainError.__init__(
            self,
            f"the server cannot verify this credential now: {what}; nothing was done, "
            f"retry after {retry_after_ms} ms with backoff (the troth SDK does). A token "
            "verified once is served from a cache and never waits for this",
            limit=LIMIT,
            **metadata,
        )
        self.limit = LIMIT
        self.retry_after_ms = retry_after_ms
        self.one_key = one_key
        """A bound of one key id's (which only wrong secrets reach), not of the pool's."""


@dataclass(slots=True)
class PoolStats:
    """What the pool did since it started (read by tests and the benchmark)."""

    runs: int = 0
    """Verifications run on a thread (a cancelled one before it ran is not counted)."""
    shared: int = 0
    """Callers who waited for a verification of the same token already under way."""
    refused: int = 0
    """Verifications refused at a bound (`VerificationsBusy`)."""


@dataclass(slots=True)
class _Flight:
    """One verification under way, and how many callers wait for it."""

    key: str
    future: Future[Principal]
    waiters: int = 0


@dataclass(slots=True)
class _Bucket:
    """A key id's allowance of verifications (a token bucket)."""

    tokens: float
    at: float


@dataclass(slots=True)
class _Admission:
    """Flights admitted (running or waiting), by token digest and per key; each key id's
    allowance (its key ids are the token file's: an unknown one never gets here)."""

    flights: dict[bytes, _Flight] = field(default_factory=dict)
    per_key: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, _Bucket] = field(default_factory=dict)


class VerifierPool:
    """Verifies credentials an `Authenticator` has not seen, on threads of its own.

    Args:
        authenticator: the server's credential sources; its `cached` (fast, on the
            event loop) answers first, its `verify` (blocking) runs on the pool.
        workers: threads verifying at once (`WORKERS`).
        max_waiting: verifications that may wait for a thread (`MAX_WAITING`).
        max_per_key: verifications running or waiting per key id (`MAX_PER_KEY`).
        per_key_rate: verifications a token-file key id may start per second
            (`PER_KEY_RATE`), in bursts of `per_key_burst` (`PER_KEY_BURST`).
        retry_after_ms: the RetryInfo delay of a refusal (`RETRY_AFTER_MS`).
        refusal_delay_s: how late a refused credential is answered (`REFUSAL_DELAY_S`).
        clock: seconds, for the rate (`time.monotonic`).

    The threads start on first use; `stop()` ends them (a verification waiting then
    is answered `VerificationsBusy`). Thread-safe: `verify` may be awaited from any
    event loop.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        *,
        workers: int = WORKERS,
        max_waiting: int = MAX_WAITING,
        max_per_key: int = MAX_PER_KEY,
        per_key_rate: float = PER_KEY_RATE,
        per_key_burst: int = PER_KEY_BURST,
        retry_after_ms: int = RETRY_AFTER_MS,
        refusal_delay_s: float = REFUSAL_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(workers, max_per_key, per_key_burst) < 1 or max_waiting < 0 or per_key_rate <= 0:
            raise ValueError(
                "workers, max_per_key and per_key_burst must be at least 1, max_waiting at "
                "least 0, per_key_rate above 0"
            )
        self.authenticator = authenticator
        self.workers = workers
        self.max_waiting = max_waiting
        self.max_per_key = max_per_key
        self.per_key_rate = per_key_rate
        self.per_key_burst = per_key_burst
        self.retry_after_ms = retry_after_ms
        self.refusal_delay_s = refusal_delay_s
        self._clock = clock
        self.stats = PoolStats()
        self._lock = threading.RLock()
        """Re-entrant: cancelling a flight under it runs its `_land` at once."""
        self._admitted = _Admission()
        self._stopped = False
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="troth-verify", initializer=_lower_priority
        )

    @property
    def admitted(self) -> int:
        """Verifications running or waiting now."""
        return len(self._admitted.flights)

    async def verify(self, token: str) -> Principal:
        """The principal `token` authenticates: from the cache of verified credentials
        when it is there, else verified on the pool. Raises `Unauthenticated` (with
        its reason) for a token refused, `VerificationsBusy` when the pool is at a
        bound or stopping; either `refusal_delay_s` late, but for the pool's own
        bounds (its waiting room, its stop)."""
        try:
            return await self._verify(token)
        except (Unauthenticated, VerificationsBusy) as exc:
            if isinstance(exc, Unauthenticated) or exc.one_key:
                await asyncio.sleep(self.refusal_delay_s)
            raise

    async def _verify(self, token: str) -> Principal:
        principal = self.authenticator.cached(token)
        if principal is not None:
            return principal
        flight = self._join(token)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Principal] = loop.create_future()

        def answer(done: Future[Principal]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_copy, done, waiter, self.retry_after_ms)

        flight.future.add_done_callback(answer)
        try:
            return await waiter
        finally:
            self._leave(flight)

    def stop(self) -> None:
        """End the threads: the verification running finishes, the waiting ones are
        answered `VerificationsBusy`, and new ones are refused so."""
        with self._lock:
            self._stopped = True
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _join(self, token: str) -> _Flight:
        """The flight verifying `token`: the one under way, or a new one if a bound
        allows it; `VerificationsBusy` otherwise."""
        digest = token_digest(token)
        key = _key(token)
        with self._lock:
            if self._stopped:
                raise VerificationsBusy("the server is stopping", self.retry_after_ms)
            admitted = self._admitted
            flight = admitted.flights.get(digest)
            if flight is not None:
                self.stats.shared += 1
                flight.waiters += 1
                return flight
            refusal = self._refusal(key) or self._spend(key)
            if refusal is not None:
                self.stats.refused += 1
                raise refusal
            future = self._executor.submit(self._run, token)
            flight = admitted.flights[digest] = _Flight(key, future, waiters=1)
            admitted.per_key[key] = admitted.per_key.get(key, 0) + 1
        future.add_done_callback(lambda _: self._land(digest, flight))
        return flight

    def _refusal(self, key: str) -> VerificationsBusy | None:
        """Why a new verification for `key` may not start now (under `_lock`)."""
        admitted = self._admitted
        # JWTs (a signature check each: microseconds) have no bound of their own: a
        # fleet reconnecting with its JWTs must not be refused four at a time.
        if key != JWT_KEY and admitted.per_key.get(key, 0) >= self.max_per_key:
            return VerificationsBusy(
                f"{self.max_per_key} verifications of key id {key!r} are already under way "
                "(other credentials are still verified)",
                self.retry_after_ms,
                one_key=True,
                key_id=key,
            )
        if len(admitted.flights) >= self.workers + self.max_waiting:
            return VerificationsBusy(
                f"{self.max_waiting} verifications of new credentials are waiting already",
                self.retry_after_ms,
            )
        return None

    def _spend(self, key: str) -> VerificationsBusy | None:
        """Take one verification from a token-file key id's allowance, or say when the
        next one will be there (under `_lock`)."""
        if key == JWT_KEY:
            return None
        now = self._clock()
        bucket = self._admitted.buckets.get(key)
        if bucket is None:
            bucket = self._admitted.buckets[key] = _Bucket(self.per_key_burst, now)
        bucket.tokens = min(
            self.per_key_burst, bucket.tokens + (now - bucket.at) * self.per_key_rate
        )
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        wait_ms = math.ceil((1 - bucket.tokens) / self.per_key_rate * 1000)
        return VerificationsBusy(
            f"key id {key!r} has started {self.per_key_rate:g} verifications a second "
            "lately, as many as one key id may (its holder needs one; other credentials are "
            "still verified)",
            max(wait_ms, self.retry_after_ms),
            one_key=True,
            key_id=key,
        )

    def _run(self, token: str) -> Principal:
        with self._lock:
            self.stats.runs += 1
        return self.authenticator.verify(token)

    def _land(self, digest: bytes, flight: _Flight) -> None:
        """A flight ended (answered, failed or cancelled): its slot is free."""
        with self._lock:
            admitted = self._admitted
            if admitted.flights.get(digest) is flight:
                del admitted.flights[digest]
            left = admitted.per_key.get(flight.key, 0) - 1
            if left > 0:
                admitted.per_key[flight.key] = left
            else:
                admitted.per_key.pop(flight.key, None)

    def _leave(self, flight: _Flight) -> None:
        """A caller stopped waiting (answered or cancelled): the last one to go cancels
        a verification that has not started, so a call cancelled while it waits frees
        its slot."""
        with self._lock:  # held: nobody joins the flight between the count and the cancel
            flight.waiters -= 1
            if flight.waiters == 0:
                flight.future.cancel()  # no-op once it runs or ran


def _key(token: str) -> str:
    """What a verification is counted under: its key id, or `JWT_KEY`."""
    if token.startswith(TOKEN_PREFIX):
        return split_token(token)[0]  # well formed: `Authenticator.cached` checked it
    return JWT_KEY


def _copy(done: Future[Principal], waiter: asyncio.Future[Principal], retry_ms: int) -> None:
    """A flight's answer into one caller's future (on the caller's loop)."""
    if waiter.done():  # the caller was cancelled meanwhile
        return
    try:
        waiter.set_result(done.result())
    except CancelledError:  # cancelled before it ran: stop()
        waiter.set_exception(VerificationsBusy("the server is stopping", retry_ms))
    except BaseException as exc:
        waiter.set_exception(exc)


def _lower_priority() -> None:
    """Run this thread `NICE` below the server (Linux: a thread's priority is its own)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICE)
    except (OSError, AttributeError):  # not Linux: the threads run at the server's priority
        pass
