"""The promise state machine (`troth_server.domain.promise`) against an independent model.

The model below is a dict of id -> `_Record` that knows nothing of the domain
module: it decides from first principles (DESIGN §2, §4.2-4.4) what every
create and settle must answer, and what a reader at `now` must see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from troth.errors import Reason
from troth_server.domain import promise as domain
from troth_server.domain.errors import (
    DomainError,
    InvalidArgument,
    PromiseAlreadyExists,
    PromiseAlreadySettled,
    PromiseNotFound,
    PromiseTimedOut,
)
from troth_server.domain.promise import (
    CreateRequest,
    Payload,
    Promise,
    PromiseState,
    SettleRequest,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms
TIMER = {"troth:timer": "true"}
SETTLE_STATES = (PromiseState.RESOLVED, PromiseState.REJECTED, PromiseState.REJECTED_CANCELED)

ids = st.sampled_from(["a", "b", "c"])
payloads = st.sampled_from(
    [
        Payload(),
        Payload({"content-type": "application/json"}, b'{"x": 1}'),
        Payload({}, b"\x00\xff"),
    ]
)
tag_sets = st.sampled_from(
    [{}, {"k": "v"}, TIMER, {"troth:timer": "false"}, {"troth:timer": "true", "k": "v"}]
)
# A key listed twice: repeating the same key is the case with the most rules behind it.
create_keys = st.sampled_from([None, "ck1", "ck1", "ck2"])
settle_keys = st.sampled_from([None, "sk1", "sk1", "sk2"])
principals = st.sampled_from([None, "alice", "bob"])
# Times move in coarse steps (plus 1 ms nudges), so `now` often lands exactly on an
# expire_time: the boundary where a promise stops being PENDING.
durations = st.sampled_from([1, 100, 200, 300, 500])
# ("ttl", ms) | ("at", ms relative to now; <= 0 is in the past) | ("never", 0)
expiries = st.one_of(
    st.tuples(st.just("ttl"), durations),
    st.tuples(st.just("at"), st.sampled_from([-100, -1, 0, 1, 100, 200, 300, 500])),
    st.tuples(st.just("never"), st.just(0)),
)


@dataclass
class _Record:
    """The model's view of one promise: what was asked for, never what the domain said."""

    param: Payload
    tags: dict[str, str]
    create_time: int
    expire_time: int | None
    create_key: str | None
    state: PromiseState | None = None  # None while nobody settled it explicitly
    value: Payload = field(default_factory=Payload)
    settle_time: int | None = None
    settle_key: str | None = None
    settled_by: str | None = None

    @property
    def timer(self) -> bool:
        return self.tags.get("troth:timer") == "true"

    def timed_out_at(self, now: int) -> bool:
        return self.state is None and self.expire_time is not None and now >= self.expire_time

    def seen_at(self, promise_id: str, now: int) -> Promise:
        """The promise as a reader at `now` must see it."""
        if self.timed_out_at(now):
            state = PromiseState.RESOLVED if self.timer else PromiseState.REJECTED_TIMEDOUT
            value, settle_time, settle_key, by = Payload(), self.expire_time, None, "troth:timeout"
        else:
            state = self.state or PromiseState.PENDING
            value, settle_time = self.value, self.settle_time
            settle_key, by = self.settle_key, self.settled_by
        return Promise(
            id=promise_id,
            state=state,
            param=self.param,
            value=value,
            tags=self.tags,
            create_time=self.create_time,
            settle_time=settle_time,
            expire_time=self.expire_time,
            idempotency_key_for_create=self.create_key,
            idempotency_key_for_settle=settle_key,
            settled_by=by,
        )


class PromiseMachine(RuleBasedStateMachine):
    """Drives the pure functions like a store would: keeps what they return, feeds it back."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.model: dict[str, _Record] = {}
        self.stored: dict[str, Promise] = {}
        self.first_settled: dict[str, Promise] = {}

    # -- rules ---------------------------------------------------------------

    @rule(
        promise_id=ids,
        param=payloads,
        tags=tag_sets,
        key=create_keys,
        expiry=expiries,
        strict=st.booleans(),
    )
    def create(
        self,
        promise_id: str,
        param: Payload,
        tags: dict[str, str],
        key: str | None,
        expiry: tuple[str, int],
        strict: bool,
    ) -> None:
        kind, amount = expiry
        request = CreateRequest(
            id=promise_id,
            param=param,
            tags=tags,
            ttl=amount if kind == "ttl" else None,
            expire_time=self.now + amount if kind == "at" else None,
            idempotency_key=key,
            strict=strict,
        )
        record = self.model.get(promise_id)
        outcome = _call(domain.create, self.stored.get(promise_id), request, self.now)

        if record is None:
            if kind == "at" and amount <= 0:
                assert isinstance(outcome, InvalidArgument), outcome
                assert outcome.field == "expire_time"
                assert "not in the future" in outcome.message
                return
            record = _Record(
                param=param,
                tags=dict(tags),
                create_time=self.now,
                expire_time=None if kind == "never" else self.now + amount,
                create_key=key,
            )
            assert outcome == (record.seen_at(promise_id, self.now), True)
            self.model[promise_id] = record
            self.stored[promise_id] = outcome[0]
            return

        if key is not None or record.create_key is not None:
            same_create = key == record.create_key
        else:
            same_create = param == record.param and tags == record.tags
        seen = record.seen_at(promise_id, self.now)
        if not same_create or (strict and seen.state is not PromiseState.PENDING):
            assert isinstance(outcome, PromiseAlreadyExists), outcome
            assert outcome.reason is Reason.ALREADY_EXISTS
            assert repr(promise_id) in outcome.message
        else:
            assert outcome == (seen, False)

    @rule(
        promise_id=ids,
        state=st.sampled_from(SETTLE_STATES),
        value=payloads,
        key=settle_keys,
        strict=st.booleans(),
        principal=principals,
    )
    def settle(
        self,
        promise_id: str,
        state: PromiseState,
        value: Payload,
        key: str | None,
        strict: bool,
        principal: str | None,
    ) -> None:
        request = SettleRequest(promise_id, state, value, key, strict, principal)
        record = self.model.get(promise_id)
        outcome = _call(domain.settle, self.stored.get(promise_id), request, self.now)

        if record is None:
            assert isinstance(outcome, PromiseNotFound), outcome
            assert outcome.promise_id == promise_id
            return
        if record.timed_out_at(self.now):
            assert isinstance(outcome, PromiseTimedOut), outcome
            assert outcome.promise == record.seen_at(promise_id, self.now)
            return
        if record.state is None:
            record.state, record.value, record.settle_time = state, value, self.now
            record.settle_key, record.settled_by = key, principal
            assert outcome == (record.seen_at(promise_id, self.now), True)
            self.stored[promise_id] = outcome[0]
            return
        repeat = key is not None and key == record.settle_key
        if repeat and (not strict or state is record.state):
            assert outcome == (record.seen_at(promise_id, self.now), False)
        else:
            assert isinstance(outcome, PromiseAlreadySettled), outcome
            assert outcome.promise == record.seen_at(promise_id, self.now)
            assert domain.SETTLE_VERBS[record.state] in outcome.message

    @rule(ms=st.sampled_from([0, 1, 99, 100, 200]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: any(domain.is_expired(p, self.now) for p in self.stored.values()))
    @rule()
    def sweep(self) -> None:
        """Persist expiries, as the sweeper does; nothing a reader sees may change."""
        for promise_id, promise in list(self.stored.items()):
            if domain.is_expired(promise, self.now):
                expired = domain.expire(promise)
                assert expired == self.model[promise_id].seen_at(promise_id, self.now)
                self.stored[promise_id] = expired

    # -- invariants ----------------------------------------------------------

    @invariant()
    def reader_sees_the_model(self) -> None:
        for promise_id, promise in self.stored.items():
            seen = domain.effective(promise, self.now)
            assert seen == self.model[promise_id].seen_at(promise_id, self.now)

    @invariant()
    def never_pending_after_expiry(self) -> None:
        for promise in self.stored.values():
            seen = domain.effective(promise, self.now)
            if promise.expire_time is not None and self.now >= promise.expire_time:
                assert seen.state is not PromiseState.PENDING
                assert not domain.is_expired(seen, self.now)
            if seen.settled_by == domain.TIMEOUT_PRINCIPAL:
                expected = (
                    PromiseState.RESOLVED if seen.is_timer else PromiseState.REJECTED_TIMEDOUT
                )
                assert seen.state is expected
                assert seen.settle_time == seen.expire_time

    @invariant()
    def settled_never_changes(self) -> None:
        for promise_id, promise in self.stored.items():
            seen = domain.effective(promise, self.now)
            if seen.is_settled:
                assert self.first_settled.setdefault(promise_id, seen) == seen


def _call(
    function: Callable[[Promise | None, Any, int], tuple[Promise, bool]],
    existing: Promise | None,
    request: CreateRequest | SettleRequest,
    now: int,
) -> tuple[Promise, bool] | DomainError:
    """The function's answer, or the DomainError it raised (any other error propagates)."""
    try:
        return function(existing, request, now)
    except DomainError as exc:
        return exc


TestPromiseMachine = PromiseMachine.TestCase
TestPromiseMachine.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)


# -- examples --------------------------------------------------------------------------


def _pending(tags: dict[str, str] | None = None) -> Promise:
    return Promise(
        id="order-1",
        state=PromiseState.PENDING,
        param=Payload(),
        value=Payload(),
        tags=tags or {},
        create_time=T0,
        expire_time=T0 + 60_000,
    )


def test_already_settled_message_names_state_principal_time_and_key() -> None:
    settled, applied = domain.settle(
        _pending(),
        SettleRequest("order-1", PromiseState.REJECTED, Payload(), "sk-1", principal="alice"),
        T0 + 1_500,
    )
    assert applied
    with pytest.raises(PromiseAlreadySettled) as caught:
        domain.settle(settled, SettleRequest("order-1", PromiseState.RESOLVED, Payload()), T0 + 2)
    message = caught.value.message
    assert message.startswith("promise 'order-1' was already rejected by 'alice' at ")
    assert "2026-01-01T00:00:01.500+00:00" in message
    # The winner's key is not the loser's to see (DESIGN §7: keys go to their owner).
    assert "with another idempotency key" in message and "sk-1" not in message
    assert "idempotency key" in message and "Read the promise" in message
    assert caught.value.metadata == {"promise_id": "order-1", "state": "REJECTED"}
    assert caught.value.reason is Reason.ALREADY_SETTLED


def test_already_settled_message_without_principal_or_key() -> None:
    canceled, _ = domain.settle(
        _pending(), SettleRequest("order-1", PromiseState.REJECTED_CANCELED, Payload()), T0
    )
    with pytest.raises(PromiseAlreadySettled) as caught:
        domain.settle(canceled, SettleRequest("order-1", PromiseState.REJECTED, Payload()), T0)
    message = caught.value.message
    assert "was already canceled at 2026-01-01T00:00:00.000+00:00 without an idempotency key" in (
        message
    )
    assert " by " not in message


def test_strict_repeat_with_other_state_is_refused() -> None:
    resolved, _ = domain.settle(
        _pending(), SettleRequest("order-1", PromiseState.RESOLVED, Payload(), "k"), T0
    )
    again = SettleRequest("order-1", PromiseState.REJECTED, Payload(), "k")
    assert domain.settle(resolved, again, T0 + 1) == (resolved, False)
    with pytest.raises(PromiseAlreadySettled, match="with this settle's idempotency key"):
        domain.settle(resolved, replace(again, strict=True), T0 + 1)


@pytest.mark.parametrize(
    ("tags", "state", "what"),
    [
        ({}, PromiseState.REJECTED_TIMEDOUT, "promise timed out"),
        (TIMER, PromiseState.RESOLVED, "timer fired"),
    ],
)
def test_timed_out_message_names_expiry_and_state(
    tags: dict[str, str], state: PromiseState, what: str
) -> None:
    pending = _pending(tags=tags)
    request = SettleRequest("order-1", PromiseState.RESOLVED, Payload())
    with pytest.raises(PromiseTimedOut) as caught:
        domain.settle(pending, request, T0 + 60_000)
    message = caught.value.message
    assert f"its {what} at 2026-01-01T00:01:00.000+00:00 (state {state.value})" in message
    assert "longer ttl" in message
    assert caught.value.promise.state is state
    assert caught.value.promise.settled_by == domain.TIMEOUT_PRINCIPAL
    assert caught.value.reason is Reason.TIMED_OUT
    # Once the sweeper persisted the expiry, a late settle gets the same answer.
    with pytest.raises(PromiseTimedOut):
        domain.settle(domain.expire(pending), request, T0 + 70_000)


def test_expiry_is_exact_to_the_millisecond() -> None:
    pending = _pending()
    assert domain.effective(pending, T0 + 59_999) is pending
    seen = domain.effective(pending, T0 + 60_000)
    assert seen.state is PromiseState.REJECTED_TIMEDOUT
    assert seen.settle_time == T0 + 60_000
    settled, applied = domain.settle(
        pending, SettleRequest("order-1", PromiseState.RESOLVED, Payload()), T0 + 59_999
    )
    assert applied and settled.state is PromiseState.RESOLVED


def test_past_expire_time_message_says_what_to_send() -> None:
    request = CreateRequest("order-1", Payload(), {}, expire_time=T0)
    with pytest.raises(InvalidArgument) as caught:
        domain.create(None, request, T0)
    assert caught.value.field == "expire_time"
    assert caught.value.message == (
        "expire_time: 2026-01-01T00:00:00.000+00:00 is not in the future (server time "
        "2026-01-01T00:00:00.000+00:00); send a later expire_time or a ttl"
    )


def test_already_exists_messages_say_why() -> None:
    keyed, _ = domain.create(
        None, CreateRequest("order-1", Payload(), {}, ttl=10, idempotency_key="k"), T0
    )
    with pytest.raises(PromiseAlreadyExists, match="different idempotency key"):
        domain.create(keyed, CreateRequest("order-1", Payload(), {}, ttl=10), T0)
    plain, _ = domain.create(None, CreateRequest("order-2", Payload(), {}), T0)
    with pytest.raises(PromiseAlreadyExists, match="different param or tags"):
        domain.create(plain, CreateRequest("order-2", Payload(), {"k": "v"}), T0)
    timed_out = CreateRequest("order-1", Payload(), {}, ttl=10, idempotency_key="k", strict=True)
    with pytest.raises(PromiseAlreadyExists, match="already timed out and the create is strict"):
        domain.create(keyed, timed_out, T0 + 10)


def test_not_found_message() -> None:
    with pytest.raises(PromiseNotFound) as caught:
        domain.settle(None, SettleRequest("nope", PromiseState.RESOLVED, Payload()), T0)
    # A settle of an unknown id may have come before the wait: the message says how.
    assert caught.value.message.startswith("promise 'nope' does not exist; check the id")
    assert "create_if_missing" in caught.value.message
    cancel = SettleRequest("nope", PromiseState.REJECTED_CANCELED, Payload())
    with pytest.raises(PromiseNotFound) as caught:
        domain.settle(None, cancel, T0)
    assert caught.value.message == "promise 'nope' does not exist; create it first or check the id"
