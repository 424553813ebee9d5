"""The verification pool and the caches in front of it (issue 26, part 6), in process,
with a real token file: a new secret costs one scrypt on the pool's own threads, within
bounds; a token verified before, an unknown key id and a token refused lately cost none.

The entries the pool is held busy with have a dearer scrypt (n=2^15, 32 MiB, about
0.1 s): a flight stays admitted until its scrypt ends, so the bounds can be checked
while it runs. The entries a test floods have a cheap one (n=16)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from troth.errors import Reason
from troth_server.api._status import status_for
from troth_server.auth import (
    Authenticator,
    AuthSources,
    Unauthenticated,
    VerificationsBusy,
    VerifierPool,
    hash_secret,
)
from troth_server.auth._tokens import REFUSED_PER_KEY

if TYPE_CHECKING:
    from collections.abc import Awaitable
    from pathlib import Path

    from troth_server.domain.access import Principal

DEAR_N = 2**15
CHEAP_N = 16


class Tokens:
    """A token file of five principals, `slow-a`, `slow-b`, `slow-c` (dear scrypt) and
    `fast-a`, `fast-b` (cheap); `good(name)` is a principal's token, `bad(name)` a fresh
    wrong secret for its key id."""

    def __init__(self, tmp_path: Path) -> None:
        self.key_ids: dict[str, str] = {}
        self.secrets: dict[str, str] = {}
        entries = []
        for name in ("slow-a", "slow-b", "slow-c", "fast-a", "fast-b"):
            key_id = secrets.token_hex(8)
            secret = secrets.token_urlsafe(16)
            n = DEAR_N if name.startswith("slow") else CHEAP_N
            self.key_ids[name], self.secrets[name] = key_id, secret
            entries.append(
                f'[[principal]]\nname = "{name}"\nroles = ["gateway"]\n'
                f'key_id = "{key_id}"\nsecret_hash = "{hash_secret(secret, n=n)}"\n'
            )
        self.path = tmp_path / "tokens.toml"
        self.path.write_text("\n".join(entries))
        self.auth = Authenticator(AuthSources(tokens_file=self.path))

    def fresh(self) -> Tokens:
        """The same tokens, with an `Authenticator` of their own (empty caches)."""
        self.auth = Authenticator(AuthSources(tokens_file=self.path))
        return self

    def good(self, name: str) -> str:
        return f"troth_{self.key_ids[name]}_{self.secrets[name]}"

    def bad(self, name: str) -> str:
        return f"troth_{self.key_ids[name]}_{secrets.token_urlsafe(16)}"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens(tmp_path_factory.mktemp("verifier-pool"))


@pytest.fixture
def tokens(token_file: Tokens) -> Tokens:
    return token_file.fresh()


def _pool(tokens: Tokens, **bounds: Any) -> VerifierPool:
    """A pool over `tokens` that answers refusals at once (but where a test says)."""
    return VerifierPool(tokens.auth, **{"refusal_delay_s": 0.0, **bounds})


async def _reason(call: Awaitable[Principal]) -> str:
    try:
        await call
    except (Unauthenticated, VerificationsBusy) as exc:
        return exc.reason.value
    return "OK"


async def _started(pool: VerifierPool, token: str) -> asyncio.Task[str]:
    """A verification admitted (or refused) before this returns."""
    task = asyncio.create_task(_reason(pool.verify(token)))
    await asyncio.sleep(0)
    return task


def test_a_token_verified_before_never_waits_while_the_pool_is_full(tokens: Tokens) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=0, max_per_key=1)
        try:
            principal = await pool.verify(tokens.good("slow-a"))
            assert principal.name == "slow-a" and pool.stats.runs == 1
            flood = await _started(pool, tokens.bad("slow-a"))
            assert pool.admitted == 1  # the one thread is busy with a wrong secret
            # The holder of the flooded key id is served from the cache, at once.
            assert await pool.verify(tokens.good("slow-a")) == principal
            # A new credential is refused at once: OVERLOADED, with the delay to wait.
            with pytest.raises(VerificationsBusy) as busy:
                await pool.verify(tokens.bad("slow-b"))
            assert busy.value.reason is Reason.OVERLOADED
            assert "retry after 250 ms" in busy.value.message
            assert await flood == "TOKEN_INVALID"
            assert pool.stats.runs == 2 and pool.stats.refused == 1
        finally:
            pool.stop()

    asyncio.run(main())


def test_one_key_id_takes_at_most_its_share_of_the_pool(tokens: Tokens) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=8, max_per_key=2)
        try:
            first = [await _started(pool, tokens.bad("slow-a")) for _ in range(2)]
            with pytest.raises(VerificationsBusy) as busy:
                await pool.verify(tokens.bad("slow-a"))
            assert busy.value.metadata == {"limit": "auth-verifications",
                                           "key_id": tokens.key_ids["slow-a"]}  # fmt: skip
            assert f"verifications of key id {tokens.key_ids['slow-a']!r}" in busy.value.message
            # Another key id still gets in, and is answered.
            other = await _started(pool, tokens.good("fast-a"))
            assert [await t for t in first] == ["TOKEN_INVALID"] * 2
            assert await other == "OK"
            assert pool.stats.runs == 3 and pool.admitted == 0
        finally:
            pool.stop()

    asyncio.run(main())


def test_one_key_id_starts_at_most_its_rate_of_verifications(tokens: Tokens) -> None:
    """Wrong secrets one after the other, each answered before the next: the key id's
    allowance (a burst of 2, then 1 a second) runs out, other key ids' does not."""
    now = [100.0]

    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=8, max_per_key=8,
                            per_key_rate=1.0, per_key_burst=2, clock=lambda: now[0])  # fmt: skip
        try:
            for _ in range(2):
                assert await _reason(pool.verify(tokens.bad("fast-a"))) == "TOKEN_INVALID"
            with pytest.raises(VerificationsBusy) as busy:
                await pool.verify(tokens.bad("fast-a"))
            assert "has started 1 verifications a second" in busy.value.message
            assert busy.value.retry_after_ms == 1000
            assert await _reason(pool.verify(tokens.good("fast-b"))) == "OK"
            now[0] += 0.5
            with pytest.raises(VerificationsBusy) as busy:
                await pool.verify(tokens.bad("fast-a"))
            assert busy.value.retry_after_ms == 500
            now[0] += 0.5
            assert await _reason(pool.verify(tokens.good("fast-a"))) == "OK"
            # Its holder, verified, is served from the cache however spent the key id is.
            assert await _reason(pool.verify(tokens.good("fast-a"))) == "OK"
            assert pool.stats.runs == 4 and pool.stats.refused == 2
        finally:
            pool.stop()

    asyncio.run(main())


def test_the_waiting_room_is_bounded_for_all_key_ids_together(tokens: Tokens) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=1, max_per_key=4)
        try:
            running = await _started(pool, tokens.bad("slow-a"))
            waiting = await _started(pool, tokens.bad("slow-b"))
            with pytest.raises(VerificationsBusy) as busy:
                await pool.verify(tokens.bad("slow-c"))
            assert "1 verifications of new credentials are waiting" in busy.value.message
            assert [await running, await waiting] == ["TOKEN_INVALID"] * 2
            assert await _reason(pool.verify(tokens.good("slow-c"))) == "OK"
        finally:
            pool.stop()

    asyncio.run(main())


def test_a_refusal_is_resource_exhausted_with_a_retry_delay() -> None:
    status = status_for(VerificationsBusy("4 verifications of key id 'k' are under way"))
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    (_, raw), *_ = status.trailing_metadata
    details = status_pb2.Status.FromString(raw).details
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert details[0].Unpack(info) and details[1].Unpack(retry)
    assert info.reason == "OVERLOADED" and retry.retry_delay.ToMilliseconds() == 250


def test_the_same_token_at_once_is_verified_once(tokens: Tokens) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=0, max_per_key=1)
        try:
            good, bad = tokens.good("slow-a"), tokens.bad("slow-b")
            answers = await asyncio.gather(*(_reason(pool.verify(t)) for t in [good] * 5))
            assert answers == ["OK"] * 5
            assert (pool.stats.runs, pool.stats.shared) == (1, 4)
            answers = await asyncio.gather(*(_reason(pool.verify(t)) for t in [bad] * 3))
            assert answers == ["TOKEN_INVALID"] * 3
            assert (pool.stats.runs, pool.stats.shared) == (2, 6)
            # Refused again from the cache of refused tokens: no run, no pool.
            assert await _reason(pool.verify(bad)) == "TOKEN_INVALID"
            assert pool.stats.runs == 2
        finally:
            pool.stop()

    asyncio.run(main())


def test_an_unknown_key_id_or_a_malformed_token_never_reaches_the_pool(tokens: Tokens) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=0, max_per_key=1)
        try:
            busy = await _started(pool, tokens.bad("slow-a"))  # the pool is full
            assert await _reason(pool.verify("troth_ffffffffffffffff_x")) == "TOKEN_UNKNOWN"
            assert await _reason(pool.verify("troth_short_x")) == "CREDENTIALS_MALFORMED"
            assert await busy == "TOKEN_INVALID"
            assert pool.stats.runs == 1 and pool.stats.refused == 0
        finally:
            pool.stop()

    asyncio.run(main())


def test_a_caller_that_gives_up_frees_its_place(tokens: Tokens) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=1, max_per_key=4)
        try:
            running = await _started(pool, tokens.bad("slow-a"))
            waiting = await _started(pool, tokens.bad("slow-b"))
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            assert pool.admitted == 1
            # Its place is free, and its scrypt never runs.
            assert await _reason(pool.verify(tokens.good("fast-a"))) == "OK"
            assert await running == "TOKEN_INVALID"
            assert pool.stats.runs == 2
        finally:
            pool.stop()

    asyncio.run(main())


def test_a_stopped_pool_answers_its_waiting_callers_and_refuses_new_ones(
    tokens: Tokens,
) -> None:
    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=1, max_per_key=4)
        running = await _started(pool, tokens.bad("slow-a"))
        waiting = await _started(pool, tokens.bad("slow-b"))
        pool.stop()
        assert await waiting == "OVERLOADED"
        assert await running == "TOKEN_INVALID"  # the one running finishes
        with pytest.raises(VerificationsBusy, match="the server is stopping"):
            await pool.verify(tokens.bad("fast-a"))

    asyncio.run(main())


def test_refused_tokens_are_remembered_per_key_id_and_bounded(tokens: Tokens) -> None:
    """A flood of fresh secrets for one key id forgets that key id's oldest refusals,
    never another key id's."""
    auth = tokens.auth
    kept, first = tokens.bad("fast-b"), tokens.bad("fast-a")
    for token in (kept, first):
        with pytest.raises(Unauthenticated):
            auth.verify(token)
    for _ in range(REFUSED_PER_KEY):
        with pytest.raises(Unauthenticated):
            auth.verify(tokens.bad("fast-a"))
    assert auth.cached(first) is None  # forgotten: the next try costs a scrypt again
    with pytest.raises(Unauthenticated) as remembered:
        auth.cached(kept)
    assert remembered.value.reason is Reason.TOKEN_INVALID
    auth.reload()  # a new table: nothing is remembered
    assert auth.cached(kept) is None


def test_a_refused_credential_is_answered_late_a_full_waiting_room_at_once(
    tokens: Tokens,
) -> None:
    """What bad credentials cost their sender: a wrong secret, an unknown key id and a
    refusal at a key id's own bound wait `refusal_delay_s`; an honest new credential
    refused by the waiting room's bound is told at once."""

    async def main() -> None:
        pool = _pool(tokens, workers=1, max_waiting=0, max_per_key=1, refusal_delay_s=60.0)
        try:
            running = await _started(pool, tokens.bad("slow-a"))
            late = [
                await _started(pool, token)
                for token in (tokens.bad("slow-a"), "troth_ffffffffffffffff_x")
            ]
            assert await _reason(pool.verify(tokens.good("slow-b"))) == "OVERLOADED"
            await asyncio.sleep(0.5)  # the scrypt may have ended: its answer waits 60 s
            assert not any(task.done() for task in [running, *late])
            for task in [running, *late]:
                task.cancel()
        finally:
            pool.stop()

    asyncio.run(main())
