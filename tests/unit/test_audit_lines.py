"""`auth.refused` lines are rate-limited per reason and subject, with the count of the
lines left out on the next one written; every refusal is counted (issue 26, part 6)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from troth.errors import Reason
from troth_server.api import _audit as audit
from troth_server.api._audit import LineLimit
from troth_server.auth import NotAllowed, Unauthenticated, VerificationsBusy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Context:
    """What `auth_refused` reads of a call: its peer."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"


def test_a_key_writes_its_lines_then_counts_the_rest_until_the_interval_ends() -> None:
    clock = Clock()
    limit = LineLimit(3, 10.0, clock=clock)
    assert [limit.admit("a") for _ in range(5)] == [0, 0, 0, None, None]
    assert limit.admit("b") == 0  # another key has lines of its own
    clock.now += 9.9
    assert limit.admit("a") is None
    clock.now += 0.1
    assert limit.admit("a") == 3  # the first line of the next interval says how many
    assert limit.admit("a") == 0


def test_the_keys_are_bounded_forgetting_the_one_unseen_longest() -> None:
    clock = Clock()
    limit = LineLimit(1, 10.0, max_keys=2, clock=clock)
    for key in ("a", "a", "b", "a", "c"):  # b is the one unseen longest when c comes
        limit.admit(key)
    assert limit.admit("a") is None  # still counted
    assert limit.admit("b") == 0  # forgotten: starts over


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fresh limit of the module's size, on a clock the test moves; a counter."""
    clock = Clock()
    monkeypatch.setattr(
        audit,
        "_refused_lines",
        LineLimit(audit.REFUSED_LINES, audit.REFUSED_INTERVAL_S, clock=clock),
    )
    return clock


def test_refusals_are_limited_per_reason_and_key_id_or_principal(lines: Clock) -> None:
    counted: list[str] = []
    audit.count_auth_refusals(counted.append)
    wrong = Unauthenticated(Reason.TOKEN_INVALID, "the token with key id 'k1' ...", key_id="k1")
    other = Unauthenticated(Reason.TOKEN_INVALID, "the token with key id 'k2' ...", key_id="k2")
    role = NotAllowed(Reason.ROLE_NOT_ALLOWED, "principal 'w' may not ...")
    busy = VerificationsBusy("4 verifications of key id 'k1' ...", key_id="k1", one_key=True)
    try:
        with capture_logs() as logs:
            for _ in range(20):
                audit.auth_refused("GetPromise", wrong, None, Context())  # type: ignore[arg-type]
            for error in (other, busy):
                audit.auth_refused("GetPromise", error, None, Context())  # type: ignore[arg-type]
            for _ in range(20):
                audit.auth_refused("CancelPromise", role, "w", Context())  # type: ignore[arg-type]
            lines.now += audit.REFUSED_INTERVAL_S
            audit.auth_refused("GetPromise", wrong, None, Context())  # type: ignore[arg-type]
    finally:
        audit.count_auth_refusals(None)
    n = audit.REFUSED_LINES
    assert len(counted) == 43
    assert counted.count("TOKEN_INVALID") == 22 and counted.count("OVERLOADED") == 1
    written = [(e["reason"], e["principal"], e.get("suppressed")) for e in logs]
    assert written == [
        *[("TOKEN_INVALID", None, None)] * n,
        ("TOKEN_INVALID", None, None),  # k2's
        ("OVERLOADED", None, None),
        *[("ROLE_NOT_ALLOWED", "w", None)] * n,
        ("TOKEN_INVALID", None, 20 - n),  # k1's, with the count of its lines left out
    ]
    assert all(e["event"] == "auth.refused" and e["peer"] == "ipv4:127.0.0.1:5555" for e in logs)


def test_unknown_key_ids_share_one_allowance(lines: Clock) -> None:
    """A key id the token file does not hold is the sender's to invent: a new one per
    call must not buy a new line per call."""
    with capture_logs() as logs:
        for n in range(20):
            unknown = Unauthenticated(Reason.TOKEN_UNKNOWN, "no token ...", key_id=f"{n:016x}")
            audit.auth_refused("GetPromise", unknown, None, Context())  # type: ignore[arg-type]
    assert len(logs) == audit.REFUSED_LINES
