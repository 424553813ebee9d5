"""The door's credential rules without a server (`api/_door.py`): a pass is trusted while
its authenticator generation is current and its JWT unexpired, looked up again after a
reload (a removed entry unknown, a narrowed grant narrowed, no scrypt again for a
kept secret), and an open stream is ended by the patrol when it may no longer go on."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from _auth import Grant, make_jwt, make_jwt_keys

from troth.errors import Reason
from troth.v1 import tasks_pb2
from troth_server.api._admission import Admission
from troth_server.api._door import Door, Pass, stream_refusal
from troth_server.auth import Authenticator, AuthError, AuthSources, Unauthenticated, mint
from troth_server.domain.access import Principal, Role

if TYPE_CHECKING:
    from pathlib import Path


def _token_file(path: Path, grants: list[Grant]) -> tuple[dict[str, str], dict[str, str]]:
    entries, tokens = {}, {}
    for grant in grants:
        minted = mint(grant.name, grant.roles, grant.groups, grant.prefixes)
        entries[grant.name], tokens[grant.name] = minted.entry, minted.token
    path.write_text("\n".join(entries.values()))
    return entries, tokens


def _door(auth: Authenticator, wall: float | None = None) -> Door:
    clock = time.time if wall is None else (lambda: wall)
    return Door(auth, Admission.with_limits(8, 8), wall=clock)


def test_a_pass_is_trusted_until_a_reload_then_looked_up_again(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    entries, tokens = _token_file(
        path, [Grant("w", ("worker",), ("gq",)), Grant("gone", ("gateway",))]
    )
    auth = Authenticator(AuthSources(tokens_file=path))
    door = _door(auth)

    async def scenario() -> None:
        w = await door.renew(Pass(Principal("x", frozenset()), tokens["w"], -1))
        gone = await door.renew(Pass(Principal("x", frozenset()), tokens["gone"], -1))
        assert w.principal.groups == {"gq"} and door.current(w) and door.current(gone)
        assert await door.renew(w) is w  # nothing changed: no look-up

        narrowed = entries["w"].replace('groups = ["gq"]', 'groups = ["gz"]')
        path.write_text(narrowed)  # "gone" removed, "w" narrowed
        assert auth.reload() == []
        assert not door.current(w)
        # The same key and secret: still verified (no scrypt), with the new grant.
        assert auth.cached(tokens["w"]) is not None
        renewed = await door.renew(w)
        assert renewed.principal.groups == {"gz"}
        with pytest.raises(Unauthenticated) as refused:
            await door.renew(gone)
        assert refused.value.reason is Reason.TOKEN_UNKNOWN

    asyncio.run(scenario())


def test_a_jwt_pass_stops_at_its_expiry(tmp_path: Path) -> None:
    keys = make_jwt_keys(tmp_path / "keys")
    auth = Authenticator(AuthSources(jwt_key_file=keys.hs_file, jwt_algorithms=("HS256",)))
    token = make_jwt(keys.hs_secret, "HS256", "g", ["gateway"], ttl=60)

    async def scenario() -> None:
        door = _door(auth)
        first = await door.renew(Pass(Principal("x", frozenset()), token, -1))
        assert first.expires_at is not None
        assert first.expires_at == pytest.approx(time.time() + 60 + 30, abs=5)
        assert door.current(first)
        assert not _door(auth, wall=first.expires_at + 0.001).current(first)

    asyncio.run(scenario())

    late = make_jwt(keys.hs_secret, "HS256", "g", ["gateway"], ttl=-31)

    async def expired() -> None:
        with pytest.raises(Unauthenticated) as refused:
            await _door(auth).renew(Pass(Principal("x", frozenset()), late, -1))
        assert refused.value.reason is Reason.TOKEN_EXPIRED

    asyncio.run(expired())


WORKER = Principal("w", frozenset({Role.WORKER}), frozenset({"gq"}))


@pytest.mark.parametrize(
    ("rpc", "now", "reason"),
    [
        ("Poll", WORKER, None),
        ("Poll", Principal("w", frozenset({Role.GATEWAY})), Reason.ROLE_NOT_ALLOWED),
        ("Poll", Principal("w", frozenset({Role.WORKER}), frozenset({"gz"})),
         Reason.GROUP_NOT_ALLOWED),
        ("Poll", Principal("w", frozenset({Role.ADMIN})), None),
        ("Calls", Principal("w", frozenset({Role.OPERATOR})), None),
        ("WatchPromises", Principal("w", frozenset({Role.WORKER})), Reason.ROLE_NOT_ALLOWED),
        ("WatchPromises", Principal("w", frozenset({Role.OPERATOR}), prefixes=("a-",)),
         Reason.OUTSIDE_PREFIXES),
        ("WatchPromise", Principal("w", frozenset({Role.OPERATOR})), None),
    ],
)  # fmt: skip
def test_what_ends_an_open_stream(rpc: str, now: Principal, reason: Reason | None) -> None:
    request = tasks_pb2.PollRequest(group="gq")
    opened = WORKER if rpc == "Poll" else Principal("w", frozenset({Role.OPERATOR}))
    refusal = stream_refusal(rpc, request, opened, now)
    assert (None if refusal is None else refusal.reason) is reason


def test_the_patrol_ends_a_waiting_stream_whose_token_was_revoked(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    _, tokens = _token_file(path, [Grant("op", ("operator",)), Grant("keep", ("operator",))])
    auth = Authenticator(AuthSources(tokens_file=path))
    door = _door(auth)
    ended: list[AuthError | None] = []

    async def stream(token: str) -> None:
        pass_ = await door.renew(Pass(Principal("x", frozenset()), token, -1))
        with door.hold(pass_, "WatchPromises", None) as held:
            held.waiting = True
            try:
                await asyncio.Event().wait()  # waits for an event that never comes
            except asyncio.CancelledError:
                ended.append(held.ended)

    async def scenario() -> None:
        revoked = asyncio.create_task(stream(tokens["op"]))
        kept = asyncio.create_task(stream(tokens["keep"]))
        for _ in range(1000):  # each token's first check is a scrypt, on a thread
            if door.open_streams == 2:
                break
            await asyncio.sleep(0.01)
        assert door.open_streams == 2
        assert await door.patrol() == 0
        path.write_text(path.read_text().split("[[principal]]")[0] + "[[principal]]"
                        + path.read_text().split("[[principal]]")[2])  # fmt: skip
        auth.reload()
        assert await door.patrol() == 1
        await revoked
        assert not kept.done()
        kept.cancel()

    asyncio.run(scenario())
    assert ended[0] is not None and ended[0].reason is Reason.TOKEN_UNKNOWN
