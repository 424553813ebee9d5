"""Public SDK arguments are checked at the API boundary: a wrong type is a TypeError, a
wrong value a ValueError, each naming the call and the argument and saying what it must
be, before any request is built (no server: the checks come first)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from troth import Client, Context


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client("127.0.0.1:1", timeout=0.5) as c:  # nothing listens: no call may be made
        yield c


CTX = Context("wf-1")

CASES: list[tuple[str, Callable[[Client], Any], type[Exception], str]] = [
    ("ttl in seconds", lambda c: c.create("a", ttl=3600), TypeError,
     "Client.create: ttl must be a timedelta (datetime.timedelta) such as timedelta(hours=1), "
     "not int 3600 (for seconds, write timedelta(seconds=3600))"),
    ("ttl as CLI text", lambda c: c.create("a", ttl="1h"), TypeError,
     "'1h30m' is the CLI's syntax"),
    ("id not a str", lambda c: c.create(7), TypeError,
     "Client.create: id must be a str such as 'approval-7', not int 7"),
    ("tags not a mapping", lambda c: c.create("a", tags=["x"]), TypeError,
     "Client.create: tags must be a mapping of str to str"),
    ("tag value not a str", lambda c: c.create("a", tags={"n": 1}), TypeError,
     "Client.create: tags['n'] must be a str, not int 1"),
    ("expire_time a number", lambda c: c.create("a", expire_time=1.5), TypeError,
     "Client.create: expire_time must be an aware datetime"),
    ("naive expire_time", lambda c: c.create("a", expire_time=datetime(2030, 1, 1)), ValueError,
     "Client.create: expire_time 2030-01-01T00:00:00 has no timezone"),
    ("title not a str", lambda c: c.create("a", title=None), TypeError,
     "Client.create: title must be a str, not NoneType"),
    ("approvers as a list", lambda c: c.create("a", approvers=["ann"]), TypeError,
     "Client.create: approvers must be a troth.Approvers"),
    ("never_expires not a bool", lambda c: c.create("a", never_expires="yes"), TypeError,
     "Client.create: never_expires must be True or False"),
    ("get by int", lambda c: c.get(7), TypeError, "Client.get: id must be a str"),
    ("page_size as text", lambda c: c.search(page_size="10"), TypeError,
     "Client.search: page_size must be a whole number"),
    ("older_than in seconds", lambda c: c.search(older_than=60), TypeError,
     "Client.search: older_than must be a timedelta (datetime.timedelta)"),
    ("resolve by int", lambda c: c.resolve(7, True), TypeError, "Client.resolve: id must be a str"),
    ("reject key not a str", lambda c: c.reject("a", idempotency_key=1), TypeError,
     "Client.reject: idempotency_key must be a str"),
    ("cancel strict not a bool", lambda c: c.cancel("a", strict=1), TypeError,
     "Client.cancel: strict must be True or False"),
    ("wait timeout as text", lambda c: c.wait("a", timeout="5s"), TypeError,
     "Client.wait: timeout must be a number of seconds such as 30, or None"),
    ("wait timeout negative", lambda c: c.wait("a", timeout=-1), ValueError,
     "Client.wait: timeout must be a positive number of seconds, not -1"),
    ("watch timeout as text", lambda c: next(c.watch("a", timeout="5s")), TypeError,
     "Client.watch: timeout must be a number of seconds"),
    ("start ttl in seconds", lambda c: c.start("wf", id="s", ttl=60), TypeError,
     "Client.start: ttl must be a timedelta (datetime.timedelta)"),
    ("start id not a str", lambda c: c.start("wf", id=None), TypeError,
     "Client.start: id must be a str"),
    ("mint ttl in seconds", lambda c: c.mint_settle_token("a", ttl=60), TypeError,
     "Client.mint_settle_token: ttl must be a timedelta (datetime.timedelta)"),
    ("mint acts_for not a str", lambda c: c.mint_settle_token("a", acts_for=["bob"]), TypeError,
     "Client.mint_settle_token: acts_for must be a str"),
    ("watch_promises tags", lambda c: c.watch_promises(tags={"a": 1}), TypeError,
     "Client.watch_promises: tags['a'] must be a str"),
    ("ctx.promise timeout in seconds", lambda _: CTX.promise(timeout=3600), TypeError,
     "ctx.promise: timeout must be a timedelta (datetime.timedelta) such as "
     "timedelta(hours=1), not int 3600"),
    ("ctx.promise id", lambda _: CTX.promise(id=7), TypeError, "ctx.promise: id must be a str"),
    ("ctx.promise tags", lambda _: CTX.promise(tags={"a": 1}), TypeError,
     "ctx.promise: tags['a'] must be a str"),
    ("ctx.run no function", lambda _: CTX.run("charge", 1), TypeError,
     "ctx.run: fn must be a function (ctx.run(fn, *args)), not str"),
    ("ctx.run retry", lambda _: CTX.run(print, retry=3), TypeError,
     "ctx.run: retry must be a troth.RetryPolicy"),
    ("ctx.sleep as text", lambda _: CTX.sleep("5m"), TypeError,
     "ctx.sleep: duration must be a timedelta (datetime.timedelta) such as timedelta(hours=1) "
     "or a number of seconds, not str '5m'"),
    ("ctx.sleep forever", lambda _: CTX.sleep(float("inf")), ValueError,
     "ctx.sleep: duration must be a finite number of seconds"),
    ("ctx.start id", lambda _: CTX.start("child", id=3), TypeError, "ctx.start: id must be a str"),
    ("ctx.promise numbered id", lambda _: CTX.promise(id="order-42.0"), ValueError,
     "ctx.promise: id 'order-42.0' ends in '.<number>', the form troth keeps for the steps "
     "it numbers itself ('<workflow id>.<n>'); name the step otherwise, e.g. "
     "'order-42.step-0'"),
    ("ctx.run numbered id", lambda _: CTX.run(print, id="wf-1.3"), ValueError,
     "ctx.run: id 'wf-1.3' ends in '.<number>'"),
    ("ctx.sleep numbered id", lambda _: CTX.sleep(1, id="a.b.7"), ValueError,
     "ctx.sleep: id 'a.b.7' ends in '.<number>'"),
    ("ctx.start numbered id", lambda _: CTX.start("child", id="x.1"), ValueError,
     "ctx.start: id 'x.1' ends in '.<number>'"),
    ("ctx.rpc numbered id", lambda _: CTX.rpc("child", id="x.2"), ValueError,
     "ctx.rpc: id 'x.2' ends in '.<number>'"),
    ("ctx.rpc group", lambda _: CTX.rpc("child", group=3), TypeError,
     "ctx.rpc: group must be a str"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "call", "kind", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_argument_is_named(
    client: Client, case: str, call: Callable[[Client], Any], kind: type[Exception], message: str
) -> None:
    with pytest.raises(kind) as caught:
        call(client)
    assert type(caught.value) is kind, case
    assert message in str(caught.value)


def test_good_arguments_still_pass_the_checks() -> None:
    assert CTX.sleep(1.5).duration == timedelta(seconds=1.5)
    assert CTX.sleep(timedelta(minutes=1)).duration == timedelta(minutes=1)
    assert CTX.promise(id="approve-1", timeout=timedelta(days=3)).timeout == timedelta(days=3)
    assert CTX.promise(id="wf-1.approval").id == "wf-1.approval"
    assert CTX.run(print, id="wf-1.3a").id == "wf-1.3a"
