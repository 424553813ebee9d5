"""Who decided, as the workflow reads it: `ctx.decision(handle)` and `decisions=True` on
`ctx.at_least`, `ctx.all` and `ctx.any` give `Decision(value, settled_by, settle_time)`
from the recorded promise, so a replay sees exactly what the first execution saw.

Pure: histories in, outcomes out (`troth.testing.replay`), no server.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any

from troth import Context, Decision, JsonCodec, Payload, Promise, PromiseRejectedError
from troth import PromiseState as S
from troth._engine import Done, Suspend
from troth.testing import replay

CODEC = JsonCodec()
T0 = datetime(2025, 1, 1, tzinfo=UTC)
Gen = Generator[Any, Any, Any]


def make(
    promise_id: str, state: S = S.RESOLVED, value: Any = None, by: str = "", at: int = 0
) -> Promise:
    settled = state is not S.PENDING
    return Promise(
        id=promise_id,
        state=state,
        param=Payload(),
        value=CODEC.encode(value) if settled else Payload(),
        tags={"troth:kind": "promise"},
        create_time=T0,
        settle_time=T0 + timedelta(seconds=at) if settled else None,
        settled_by=by if settled else "",
    )


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _three(ctx: Context) -> Gen:
    handles = []
    for _ in range(3):
        handles.append((yield ctx.promise()))
    return handles


def test_a_single_decision_carries_its_settler_and_replays_the_same() -> None:
    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise()
        decision = yield ctx.decision(approval)
        return {"value": decision.value, "by": decision.settled_by, "at": decision.settle_time}

    assert replay(wf, [], [make("r.0", S.PENDING)], root_id="r") == Suspend(("r.0",))
    history = [make("r.0", value={"ok": True}, by="alice", at=5)]
    expected = Done({"value": {"ok": True}, "by": "alice", "at": at(5)})
    assert replay(wf, [], history, root_id="r") == expected
    # Another replay of the same record: the same decision, whoever replays it.
    assert replay(wf, [], list(history), root_id="r") == expected


def test_a_decision_that_was_a_rejection_raises_like_a_plain_yield() -> None:
    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise()
        try:
            yield ctx.decision(approval)
        except PromiseRejectedError as exc:
            return f"declined: {exc.value}"
        return "approved"

    history = [make("r.0", S.REJECTED, "off-brand", by="bob", at=1)]
    assert replay(wf, [], history, root_id="r") == Done("declined: off-brand")


def test_a_distinct_quorum_says_who_approved_in_settle_order() -> None:
    def wf(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        return (yield ctx.at_least(2, handles, distinct=True, decisions=True))

    # bob approved twice: his second counts once, so carol's vote completes the quorum.
    history = [
        make("r.0", value="yes", by="bob", at=1),
        make("r.1", value="yes again", by="bob", at=2),
        make("r.2", value="fine", by="carol", at=3),
    ]
    assert replay(wf, [], history, root_id="r") == Done(
        [Decision("r.0", "yes", "bob", at(1)), Decision("r.2", "fine", "carol", at(3))]
    )
    # Without `decisions`, the same quorum gives the bare values, as before.

    def plain(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        return (yield ctx.at_least(2, handles, distinct=True))

    assert replay(plain, [], history, root_id="r") == Done(["yes", "fine"])


def test_a_link_settle_counts_as_its_principal_in_a_distinct_quorum() -> None:
    def wf(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        return (yield ctx.at_least(2, handles, distinct=True, decisions=True))

    # bob once directly, once by a link that acts for him: one vote.
    link = "bob via settle-token k1:Xq3v0b8yTn2LhQaD"
    history = [
        make("r.0", value="yes", by="bob", at=1),
        make("r.1", value="yes again", by=link, at=2),
        make("r.2", value="fine", by="carol", at=3),
    ]
    assert replay(wf, [], history, root_id="r") == Done(
        [Decision("r.0", "yes", "bob", at(1)), Decision("r.2", "fine", "carol", at(3))]
    )


def test_all_and_any_give_decisions_too() -> None:
    def both(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        every = yield ctx.all(handles, decisions=True)
        first = yield ctx.any(handles, decisions=True)
        return [d.settled_by for d in every], first

    history = [
        make("r.0", value=0, by="alice", at=9),
        make("r.1", value=1, by="bob", at=3),
        make("r.2", value=2, by="carol", at=6),
    ]
    assert replay(both, [], history, root_id="r") == Done(
        (["alice", "bob", "carol"], Decision("r.1", 1, "bob", at(3)))
    )
