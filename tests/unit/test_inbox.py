"""The inbox's pure parts: event filters and types, page tokens, event buffers, CLI output."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from troth import Payload, PromiseEvent, PromiseEventType
from troth import Promise as SdkPromise
from troth import PromiseState as SdkState
from troth._cli import main
from troth._cli.approvals import format_event, format_inbox, inbox_tags
from troth._durations import format_duration
from troth_server import paging
from troth_server.domain.errors import InvalidPageToken
from troth_server.domain.promise import TIMEOUT_PRINCIPAL, Promise, PromiseState
from troth_server.store import PromiseOrder
from troth_server.watch import (
    EventFilter,
    EventsMissed,
    EventType,
    EventWatch,
    WatchFellBehind,
    WatchHub,
    events_from_announcement,
    events_from_changes,
    settle_event_type,
)
from troth_server.watch import PromiseEvent as ServerEvent
from troth_server.writes.batch import StateChange

T0 = 1_767_225_600_000


def promise(promise_id: str = "p", **fields: object) -> Promise:
    base = Promise(
        id=promise_id,
        state=PromiseState.PENDING,
        param=Payload(),  # type: ignore[arg-type]
        value=Payload(),  # type: ignore[arg-type]
        tags={},
        create_time=T0,
        expire_time=T0 + 60_000,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def settled(p: Promise, state: PromiseState, by: str = "alice") -> Promise:
    return replace(p, state=state, settle_time=T0 + 1, settled_by=by)


# -- filters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "matching", "not_matching"),
    [
        ("*", ["a", "wf.0", ""], []),
        ("wf.*", ["wf.0", "wf.", "wf.1.2"], ["wf", "xwf.0", "wfx0"]),
        ("*.0", ["wf.0", ".0"], ["wf.01", "wf_0"]),
        ("a*b*c", ["abc", "a-b-c", "aXXbYYc"], ["ab", "acb"]),
        ("order_1", ["order_1"], ["orderX1", "order_12"]),  # `_` is literal, not one character
        ("p.+=", ["p.+="], ["p..="]),  # regex characters are literal
    ],
)
def test_the_id_glob_has_only_the_star(
    glob: str, matching: list[str], not_matching: list[str]
) -> None:
    wanted = EventFilter(glob)
    assert [i for i in matching if wanted.matches(promise(i))] == matching
    assert [i for i in not_matching if wanted.matches(promise(i))] == []


def test_tags_must_all_be_present_with_the_exact_value() -> None:
    wanted = EventFilter("*", {"troth:kind": "promise", "team": "ed"})
    assert wanted.matches(promise(tags={"troth:kind": "promise", "team": "ed", "x": "y"}))
    assert not wanted.matches(promise(tags={"troth:kind": "promise"}))
    assert not wanted.matches(promise(tags={"troth:kind": "promise", "team": "Ed"}))
    assert not wanted.matches(promise(tags={"troth:kind": "promise", "team": ""}))
    assert EventFilter("*", {"team": ""}).matches(promise(tags={"team": ""}))


# -- event types -------------------------------------------------------------------------


def test_expiry_is_timed_out_and_anything_else_settled() -> None:
    p = promise()
    assert settle_event_type(settled(p, PromiseState.REJECTED_TIMEDOUT, TIMEOUT_PRINCIPAL)) == (
        EventType.TIMED_OUT
    )
    timer = replace(p, tags={"troth:timer": "true"})
    fired = settled(timer, PromiseState.RESOLVED, TIMEOUT_PRINCIPAL)
    assert settle_event_type(fired) == EventType.TIMED_OUT
    for state in (PromiseState.RESOLVED, PromiseState.REJECTED, PromiseState.REJECTED_CANCELED):
        assert settle_event_type(settled(p, state)) == EventType.SETTLED


def test_events_of_a_commit() -> None:
    a, b, c = promise("a"), promise("b"), promise("c")
    done_b = settled(b, PromiseState.RESOLVED)
    done_c = settled(c, PromiseState.REJECTED_TIMEDOUT, TIMEOUT_PRINCIPAL)
    changes = [
        StateChange(a, None, None),
        StateChange(b, None, None),  # created, then settled in the same commit
        StateChange(done_b, PromiseState.PENDING, "alice"),
        StateChange(done_c, PromiseState.PENDING, TIMEOUT_PRINCIPAL),
        # A rewrite of a settled promise (adopted by its creator) is no event.
        StateChange(done_b, PromiseState.RESOLVED, None),
    ]
    assert [(e.type, e.promise.id) for e in events_from_changes(changes)] == [
        (EventType.CREATED, "a"),
        (EventType.CREATED, "b"),
        (EventType.SETTLED, "b"),
        (EventType.TIMED_OUT, "c"),
    ]
    # Created already settled, as one change: both events.
    early = settled(promise("e"), PromiseState.REJECTED)
    assert [e.type for e in events_from_changes([StateChange(early, None, "bob")])] == [
        EventType.CREATED,
        EventType.SETTLED,
    ]


def test_events_of_another_replicas_commit_come_from_what_was_read() -> None:
    new, both, gone = promise("new"), promise("both"), promise("gone")
    found = {
        "new": new,
        "both": settled(both, PromiseState.RESOLVED),
        "still": promise("still"),  # announced settled, but read PENDING: not an event
    }
    events = events_from_announcement(["new", "both", "gone"], ["both", "still"], found)
    assert [(e.type, e.promise.id) for e in events] == [
        (EventType.CREATED, "new"),
        (EventType.CREATED, "both"),
        (EventType.SETTLED, "both"),
    ]
    assert gone.id not in {e.promise.id for e in events}


# -- page tokens -------------------------------------------------------------------------

ALL = frozenset[PromiseState]()


@pytest.mark.parametrize(
    "cursor",
    [paging.Cursor(7), paging.Cursor(7, T0), paging.Cursor(7, None)],
)
@pytest.mark.parametrize("order", list(PromiseOrder))
def test_a_token_names_its_cursor(order: PromiseOrder, cursor: paging.Cursor) -> None:
    query = paging.fingerprint("a*", ALL, {"k": "v"}, order)
    decoded = paging.decode(paging.encode(cursor, order, query), order, query)
    expected = cursor.expire_time if order is PromiseOrder.EXPIRE_TIME_ASC else None
    assert decoded == paging.Cursor(7, expected)


def test_a_token_is_refused_by_another_order_or_query() -> None:
    asc = paging.fingerprint("*", ALL, {})
    token = paging.encode(paging.Cursor(3), PromiseOrder.CREATED_ASC, asc)
    desc = paging.fingerprint("*", ALL, {}, PromiseOrder.CREATED_DESC)
    with pytest.raises(InvalidPageToken, match=r"order CREATED_ASC.*asks for CREATED_DESC"):
        paging.decode(token, PromiseOrder.CREATED_DESC, desc)
    for other in (
        paging.fingerprint("b*", ALL, {}),
        paging.fingerprint("*", frozenset({PromiseState.PENDING}), {}),
        paging.fingerprint("*", ALL, {"k": "v"}),
        paging.fingerprint("*", ALL, {}, PromiseOrder.CREATED_ASC, created_before=T0),
    ):
        assert other != asc
        with pytest.raises(InvalidPageToken, match="different search"):
            paging.decode(token, PromiseOrder.CREATED_ASC, other)


@pytest.mark.parametrize(
    "token",
    [
        "not a token!",
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
        base64.urlsafe_b64encode(b'{"after": "7", "query": "q"}').decode(),
        base64.urlsafe_b64encode(b'{"after": 0, "query": "q"}').decode(),
        base64.urlsafe_b64encode(b'{"after": true, "query": "q"}').decode(),
    ],
)
def test_a_malformed_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidPageToken, match="not a token this server issued"):
        paging.decode(token, PromiseOrder.CREATED_ASC, "q")


def test_tokens_from_before_orders_still_work() -> None:
    # What servers issued before SearchPromises had `order` (a rolling upgrade).
    states = frozenset({PromiseState.PENDING})
    legacy_query = json.dumps(["x*", sorted(states), sorted({"k": "v"}.items())])
    legacy_fingerprint = hashlib.sha256(legacy_query.encode()).hexdigest()[:16]
    raw = json.dumps({"after": 41, "query": legacy_fingerprint}).encode()
    legacy_token = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    query = paging.fingerprint("x*", states, {"k": "v"})
    assert query == legacy_fingerprint
    assert paging.decode(legacy_token, PromiseOrder.CREATED_ASC, query) == paging.Cursor(41)


# -- event buffers -----------------------------------------------------------------------


def change(p: Promise) -> StateChange:
    return StateChange(p, None, None)


def next_events(watch_iter: object, count: int) -> list[ServerEvent]:
    return [next(watch_iter) for _ in range(count)]  # type: ignore[call-overload]


def test_a_watch_gets_the_matching_events_of_later_commits_in_order() -> None:
    hub, stopping = WatchHub(), threading.Event()
    hub.publish_changes([change(promise("before"))])  # nobody watches yet: nothing kept
    sub = hub.subscribe_events(EventFilter("in.*"), backlog=10)
    watch = EventWatch(sub, stopping)
    events = iter(watch)
    hub.publish_changes([change(promise("out.1")), change(promise("in.1"))])
    hub.publish_changes([change(promise("in.2"))])
    assert [e.promise.id for e in next_events(events, 2)] == ["in.1", "in.2"]
    watch.cancel()
    assert list(events) == []
    assert not hub._event_subscriptions, "an ended watch unsubscribes"


def test_a_watch_that_falls_behind_is_ended_and_drops_what_it_held() -> None:
    hub = WatchHub()
    sub = hub.subscribe_events(EventFilter(), backlog=3)
    sub.offer([ServerEvent(EventType.CREATED, promise(f"p{i}")) for i in range(2)])
    sub.offer([ServerEvent(EventType.CREATED, promise(f"p{i}")) for i in range(2, 4)])
    sub.offer([ServerEvent(EventType.CREATED, promise("later"))])  # after the fault: dropped
    events, fault = sub.take()
    assert events == []
    assert isinstance(fault, WatchFellBehind)
    assert "more than 3 events behind" in fault.message
    assert "re-list with SearchPromises" in fault.message
    with pytest.raises(WatchFellBehind):
        list(EventWatch(sub, threading.Event()))


def test_missed_events_end_every_watch_after_what_it_already_holds() -> None:
    hub = WatchHub()
    watches = [EventWatch(hub.subscribe_events(EventFilter(), 10), threading.Event())]
    hub.publish_changes([change(promise("seen"))])
    hub.events_missed()
    seen: list[str] = []
    with pytest.raises(EventsMissed, match="reconnect, and re-list"):
        for event in watches[0]:
            seen.append(event.promise.id)
    assert seen == ["seen"]


def test_a_failed_read_of_another_replicas_promises_ends_the_watches() -> None:
    hub = WatchHub()
    watch = EventWatch(hub.subscribe_events(EventFilter(), 10), threading.Event())

    def read(ids: object) -> list[Promise]:
        raise OSError("database gone")

    hub.publish_remote(["x"], [], read)
    with pytest.raises(EventsMissed, match="database gone"):
        list(watch)


def test_a_stopping_server_ends_watches_quietly() -> None:
    hub, stopping = WatchHub(), threading.Event()
    watch = EventWatch(hub.subscribe_events(EventFilter(), 10), stopping)
    done = threading.Event()
    results: list[list[ServerEvent]] = []

    def consume() -> None:
        results.append(list(watch))
        done.set()

    threading.Thread(target=consume).start()
    stopping.set()
    hub.wake_all()
    assert done.wait(10)
    assert results == [[]]


# -- CLI output --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=-5), "0s"),
        (timedelta(seconds=45), "45s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=2, minutes=5, seconds=9), "2h5m"),
        (timedelta(days=3), "3d"),
        (timedelta(days=3, minutes=5), "3d"),
        (timedelta(days=3, hours=4), "3d4h"),
    ],
)
def test_ages(delta: timedelta, text: str) -> None:
    assert format_duration(delta) == text


def test_inbox_tags() -> None:
    assert inbox_tags(None, []) == {"troth:kind": "promise"}
    assert inbox_tags("g", [("team", "ed")]) == {
        "troth:kind": "promise",
        "troth:group": "g",
        "team": "ed",
    }


NOW = datetime(2030, 1, 2, 12, 0, tzinfo=UTC)


def sdk_promise(**fields: object) -> SdkPromise:
    base = SdkPromise(
        id="publish-7.0",
        state=SdkState.PENDING,
        param=Payload(),
        value=Payload(),
        tags={"troth:kind": "promise", "troth:group": "editors", "post": "7"},
        create_time=NOW - timedelta(hours=26),
        expire_time=NOW + timedelta(minutes=90),
        title="Publish post 7?",
        requested_by="publish/publish-7",
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_the_inbox_table() -> None:
    table = format_inbox([sdk_promise(), sdk_promise(id="x", expire_time=None, title="")], NOW)
    lines = table.splitlines()
    assert lines[0] == (
        "ID           TITLE            AGE   DEADLINE  REQUESTED BY       GROUP    TAGS"
    )
    assert lines[1].split("  ")[0] == "publish-7.0"
    for cell in ("Publish post 7?", "1d2h", "in 1h30m", "publish/publish-7", "editors", "post=7"):
        assert cell in lines[1]
    assert "troth:kind" not in table
    assert "never" in lines[2]


def test_event_lines() -> None:
    created = PromiseEvent(PromiseEventType.CREATED, sdk_promise())
    assert format_event(created) == (
        "2030-01-01 10:00:00Z  waiting    publish-7.0  'Publish post 7?'  "
        "(requested by publish/publish-7)"
    )
    done = sdk_promise(state=SdkState.REJECTED, settle_time=NOW, settled_by="alice")
    line = format_event(PromiseEvent(PromiseEventType.SETTLED, done))
    assert line.startswith("2030-01-02 12:00:00Z  settled    publish-7.0")
    assert line.endswith("REJECTED by alice")


def test_reject_takes_a_reason_or_a_value_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["approvals", "reject", "p", "--reason", "no", "--value", "1"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_bad_older_than_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["approvals", "list", "--older-than", "soon"]) == 2
    assert "argument --older-than: invalid duration 'soon'" in capsys.readouterr().err
