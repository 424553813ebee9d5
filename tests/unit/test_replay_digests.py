"""Replay checks what was asked (DESIGN §4 rule 7): the `troth:args` digest of each step.

The engine alone, no server: a first execution records its steps (with the
tags the engine gives them), then changed code replays against that history.
Same kind and function with other arguments is non-determinism naming both
commands; a step may opt out (`check_args=False`); histories recorded before
digests (no `troth:args` tag) replay as before. A promise's digest covers what
its human sees (issue 27 item 4: title, message, tags, approvers) from digest
version 2 on; one recorded in version 1 (id, timeout, schema) is checked on
those only. The real-server runs of the issue's routers are
tests/integration/test_replay_router.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from troth import (
    Approvers,
    Context,
    JsonCodec,
    NonDeterminismError,
    Payload,
    Promise,
    PromiseRejectedError,
    PromiseState,
    RetryPolicy,
)
from troth._cli.replay import check_history, render_result
from troth._commands import TAG_ARGS, CreatePromise, RunStep, SettleToken
from troth._digests import (
    DIGEST_LENGTH,
    args_digest,
    canonical_json,
    digest_version,
    recorded_version,
)
from troth._engine import CreateStep, Done, Engine, Failed, Outcome, Suspend
from troth.testing import History, load_histories, replay, replay_file

FIXTURES = Path(__file__).parent.parent / "fixtures" / "histories"
DIGESTS = Path(__file__).parent.parent / "fixtures" / "digests"
CODEC = JsonCodec()
T0 = datetime(2025, 1, 1, tzinfo=UTC)
Gen = Generator[Any, Any, Any]
CALLS: list[tuple[Any, ...]] = []


def do_branch(branch: str, ticket: str = "") -> str:
    CALLS.append((branch, ticket))
    return f"{branch} done"


def record(workflow: Callable[..., Gen], args: list[Any], root_id: str = "r") -> list[Promise]:
    """Run `workflow` as a first execution would: each step recorded with the engine's tags.

    Run steps call their function; every other step is left pending, and the
    run stops at the first suspend.
    """
    promises: list[Promise] = []
    with Engine(workflow, args, root_id=root_id) as engine:
        outcome = engine.advance()
        while isinstance(outcome, CreateStep):
            command = outcome.command
            state, value = PromiseState.PENDING, Payload()
            if isinstance(command, RunStep):
                state, value = PromiseState.RESOLVED, CODEC.encode(command.fn(*command.args))
            promise = Promise(
                id=outcome.step_id,
                state=state,
                param=outcome.param,
                value=value,
                tags=dict(outcome.tags),
                create_time=T0,
                settle_time=T0 if state is PromiseState.RESOLVED else None,
            )
            promises.append(promise)
            outcome = engine.advance([promise])
    CALLS.clear()
    return promises


def resolved(promises: list[Promise], promise_id: str, value: Any) -> list[Promise]:
    """The history with `promise_id` resolved (a human approved)."""
    return [
        Promise(
            id=p.id,
            state=PromiseState.RESOLVED,
            param=p.param,
            value=CODEC.encode(value),
            tags=p.tags,
            create_time=p.create_time,
            settle_time=T0 + timedelta(seconds=5),
        )
        if p.id == promise_id
        else p
        for p in promises
    ]


def router(route: dict[str, str]) -> Callable[..., Gen]:
    """The issue's router: the branch comes from outside the history (here, `route`)."""

    def wf(ctx: Context, ticket: str) -> Gen:
        branch = route["branch"]
        yield ctx.run(do_branch, branch)
        approval = yield ctx.promise()
        decision = yield approval
        yield ctx.run(do_branch, f"{branch} after {decision}")
        return branch

    return wf


# -- the check ---------------------------------------------------------------------


def test_the_same_function_with_other_arguments_is_nondeterminism_naming_both() -> None:
    route = {"branch": "human_review"}
    history = resolved(record(router(route), ["t-1"]), "r.1", "approved")
    assert TAG_ARGS in history[0].tags and len(history[0].tags[TAG_ARGS]) == DIGEST_LENGTH

    route["branch"] = "auto_reply"  # the input changed between suspend and resume
    with Engine(router(route), ["t-1"], root_id="r", history=history) as engine:
        outcome = engine.advance()
    assert isinstance(outcome, Failed)
    error = outcome.error
    assert isinstance(error, NonDeterminismError)
    assert (error.position, error.step_id) == (0, "r.0")
    recorded = history[0].tags[TAG_ARGS]
    assert error.recorded == f"run(do_branch) with arguments digest {recorded}"
    assert error.yielded is not None
    assert error.yielded.startswith("run(do_branch) with arguments ('auto_reply',), digest ")
    assert error.yielded.endswith(str(args_digest(RunStep(do_branch, ("auto_reply",)))))
    message = str(error)
    assert "step 0" in message and recorded in message and "'auto_reply'" in message
    assert CALLS == []  # neither the recorded step's result nor a new run: it stops

    with pytest.raises(NonDeterminismError):
        replay(router(route), ["t-1"], history, root_id="r")


def test_the_same_arguments_replay_to_the_end() -> None:
    route = {"branch": "human_review"}
    history = resolved(record(router(route), ["t-1"]), "r.1", "approved")
    with Engine(router(route), ["t-1"], root_id="r", history=history) as engine:
        outcome = engine.advance()
    assert isinstance(outcome, CreateStep) and outcome.position == 2
    assert isinstance(outcome.command, RunStep)
    assert outcome.command.args == ("human_review after approved",)


def test_a_step_that_opts_out_continues_with_the_recorded_result() -> None:
    def emailer(stamp: str) -> Callable[..., Gen]:
        def wf(ctx: Context) -> Gen:
            sent = yield ctx.run(do_branch, f"mail sent at {stamp}", check_args=False)
            return sent

        return wf

    history = record(emailer("09:00"), [])
    assert TAG_ARGS not in history[0].tags  # nothing to check, nothing recorded
    assert replay(emailer("09:05"), [], history, root_id="r") == Done("mail sent at 09:00 done")
    assert CALLS == []


def test_opting_out_on_either_side_skips_the_check() -> None:
    def wf(branch: str, check: bool) -> Callable[..., Gen]:
        def workflow(ctx: Context) -> Gen:
            return (yield ctx.run(do_branch, branch, check_args=check))

        return workflow

    checked = record(wf("a", True), [])
    assert replay(wf("b", False), [], checked, root_id="r") == Done("a done")
    unchecked = record(wf("a", False), [])
    assert replay(wf("b", True), [], unchecked, root_id="r") == Done("a done")


def test_a_history_recorded_before_digests_replays_as_before() -> None:
    route = {"branch": "human_review"}
    old = [
        Promise(
            id=p.id,
            state=p.state,
            param=p.param,
            value=p.value,
            tags={k: v for k, v in p.tags.items() if k != TAG_ARGS},
            create_time=p.create_time,
            settle_time=p.settle_time,
        )
        for p in resolved(record(router(route), ["t-1"]), "r.1", "approved")
    ]
    route["branch"] = "auto_reply"
    outcome = replay(router(route), ["t-1"], old, root_id="r")
    assert isinstance(outcome, CreateStep) and outcome.position == 2  # as before: no check


def send_email(approval_id: str) -> str:
    raise AssertionError("replay never runs a recorded step")


def charge(n: int) -> dict[str, int]:
    raise AssertionError("replay never runs a recorded step")


def refund(n: int) -> dict[str, int]:
    raise AssertionError("replay never runs a recorded step")


def publish(ctx: Context, post_id: str) -> Gen:
    """The workflow that recorded the publish_*.json fixtures (as in test_engine.py)."""
    approval = yield ctx.promise(timeout=timedelta(days=3))
    yield ctx.run(send_email, approval.id)
    decision = yield approval
    return {"post": post_id, "decision": decision}


def order(ctx: Context, n: int) -> Gen:
    """The workflow that recorded order_compensated.json (as in test_engine.py)."""
    started = yield ctx.now()
    yield ctx.run(charge, n)
    try:
        yield ctx.rpc("ship", n)
        status = "shipped"
    except PromiseRejectedError as exc:
        yield ctx.run(refund, n)
        status = f"refunded: {exc.value['message']}"
    return {"order": n, "status": status, "at": started.isoformat()}


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_the_recorded_fixture_histories_have_no_digest_and_still_replay(path: Path) -> None:
    histories = load_histories(path)
    assert histories and all(TAG_ARGS not in p.tags for h in histories for p in h.promises)
    outcomes = replay_file(path, {"publish": publish, "order": order})
    assert len(outcomes) == len(histories)
    assert all(isinstance(o, Done | Suspend) for o in outcomes), outcomes
    # Today's code records digests for the same steps; the old history does not care.
    with Engine(publish, ["post-7"], root_id="p") as engine:
        step = engine.advance()
        assert isinstance(step, CreateStep) and TAG_ARGS in step.tags


# -- what each command's digest covers ---------------------------------------------


def _mismatch(first: Callable[[Context], Any], second: Callable[[Context], Any]) -> Outcome:
    """Record a workflow yielding `first(ctx)` then waiting; replay one yielding `second(ctx)`.

    The same arguments replay to the same wait (`Suspend`).
    """

    def v1(ctx: Context) -> Gen:
        yield first(ctx)
        handle = yield ctx.promise()
        return (yield handle)

    def v2(ctx: Context) -> Gen:
        yield second(ctx)
        handle = yield ctx.promise()
        return (yield handle)

    history = record(v1, [])
    with Engine(v2, [], root_id="r", history=history) as engine:
        return engine.advance()


def _diverges_at_0(outcome: Outcome) -> bool:
    return (
        isinstance(outcome, Failed)
        and isinstance(outcome.error, NonDeterminismError)
        and outcome.error.position == 0
        and "with arguments" in (outcome.error.recorded or "")
    )


@dataclass(frozen=True)
class Ticket:
    id: str
    priority: int


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (lambda c: c.run(do_branch, "a"), lambda c: c.run(do_branch, "b")),
        (lambda c: c.run(do_branch, "a"), lambda c: c.run(do_branch, "a", "t")),
        (
            lambda c: c.run(do_branch, Ticket("t", 1)),
            lambda c: c.run(do_branch, Ticket("t", 2)),
        ),
        (
            lambda c: c.run(functools.partial(do_branch, ticket="t-1"), "a"),
            lambda c: c.run(functools.partial(do_branch, ticket="t-2"), "a"),
        ),
        (lambda c: c.promise(), lambda c: c.promise(timeout=timedelta(days=1))),
        (
            lambda c: c.promise(timeout=timedelta(days=1)),
            lambda c: c.promise(timeout=timedelta(days=2)),
        ),
        (
            lambda c: c.promise(schema={"type": "object"}),
            lambda c: c.promise(schema={"type": "string"}),
        ),
        (lambda c: c.promise(title="Approve?"), lambda c: c.promise(title="Approve now?")),
        (lambda c: c.promise(message="at 09:00"), lambda c: c.promise(message="at 09:05")),
        (lambda c: c.promise(tags={"t": "1"}), lambda c: c.promise(tags={"t": "2"})),
        (lambda c: c.promise(), lambda c: c.promise(tags={"t": "1"})),
        (
            lambda c: c.promise(approvers=Approvers(principals=["ada"])),
            lambda c: c.promise(approvers=Approvers(principals=["bob"])),
        ),
        (lambda c: c.promise(), lambda c: c.promise(approvers=Approvers(roles=["legal"]))),
        (
            lambda c: c.promise(approvers=Approvers(not_requester=True)),
            lambda c: c.promise(approvers=Approvers()),
        ),
        (lambda c: c.start("child", 1), lambda c: c.start("child", 2)),
        (lambda c: c.sleep(60), lambda c: c.sleep(61)),
    ],
    ids=[
        "run-args",
        "run-arity",
        "run-dataclass",
        "run-partial",
        "promise-timeout-added",
        "promise-timeout",
        "promise-schema",
        "promise-title",
        "promise-message",
        "promise-tags",
        "promise-tags-added",
        "promise-approvers",
        "promise-approvers-added",
        "promise-four-eyes",
        "start-args",
        "sleep-duration",
    ],
)
def test_each_command_s_arguments_are_checked(
    first: Callable[[Context], Any], second: Callable[[Context], Any]
) -> None:
    assert _diverges_at_0(_mismatch(first, second))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (lambda c: c.run(do_branch, "a"), lambda c: c.run(do_branch, "a")),
        (lambda c: c.run(do_branch, ("a", 1)), lambda c: c.run(do_branch, ["a", 1])),
        (
            lambda c: c.run(do_branch, {"x": 1, "y": 2}),
            lambda c: c.run(do_branch, {"y": 2, "x": 1}),
        ),
        (
            lambda c: c.run(do_branch, "a"),
            lambda c: c.run(do_branch, "a", retry=RetryPolicy(max_attempts=5)),
        ),
        (
            lambda c: c.promise(title="Approve?", message="at 09:00", tags={"t": "1"}),
            lambda c: c.promise(
                title="Approve now?", message="at 09:05", tags={"t": "2"}, check_args=False
            ),
        ),
        (
            lambda c: c.promise(tags={"a": "1", "b": "2"}, approvers=Approvers(["x", "y"])),
            lambda c: c.promise(tags={"b": "2", "a": "1"}, approvers=Approvers(["y", "x", "y"])),
        ),
        (lambda c: c.sleep(60), lambda c: c.sleep(timedelta(minutes=1))),
        (lambda c: c.start("child", 1), lambda c: c.start("child", 1, group="elsewhere")),
        (lambda c: c.sleep(60), lambda c: c.sleep(61, check_args=False)),
        (lambda c: c.promise(), lambda c: c.promise(timeout=timedelta(1), check_args=False)),
        (lambda c: c.start("child", 1), lambda c: c.start("child", 2, check_args=False)),
    ],
    ids=[
        "same",
        "tuple-is-list",
        "dict-order",
        "retry-policy",
        "promise-texts-and-tags-opted-out",
        "promise-tag-and-approver-order",
        "seconds-or-timedelta",
        "start-group",
        "sleep-opted-out",
        "promise-opted-out",
        "start-opted-out",
    ],
)
def test_what_is_not_part_of_the_digest_replays(
    first: Callable[[Context], Any], second: Callable[[Context], Any]
) -> None:
    outcome = _mismatch(first, second)
    assert isinstance(outcome, Suspend), outcome


def test_arguments_with_no_canonical_encoding_are_recorded_without_a_digest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Opaque:
        pass

    caplog.set_level("DEBUG", logger="troth.engine")
    assert args_digest(RunStep(do_branch, (Opaque(),))) is None
    assert args_digest(RunStep(do_branch, (float("nan"),))) is None
    assert "no canonical encoding" in caplog.text

    def wf(ctx: Context) -> Gen:
        return (yield ctx.run(lambda _: "ran", Opaque()))

    history = record(wf, [])
    assert TAG_ARGS not in history[0].tags
    assert replay(wf, [], history, root_id="r") == Done("ran")  # another Opaque: not checked


def test_now_and_random_ask_nothing() -> None:
    def wf(ctx: Context) -> Gen:
        yield ctx.now()
        yield ctx.random()

    with Engine(wf, [], root_id="r") as engine:
        step = engine.advance()
        assert isinstance(step, CreateStep) and TAG_ARGS not in step.tags


# -- what the human was asked (issue 27 item 4) ---------------------------------------


def asker(route: dict[str, Any]) -> Callable[..., Gen]:
    """Both branches park on the same-shaped approval: only what `route["asked"]` names
    (its title, its tags or its approvers) says which branch asks."""

    def wf(ctx: Context, ticket: str) -> Gen:
        branch, asked = route["branch"], route.get("asked", "title")
        approval = yield ctx.promise(
            title=f"Approve the {branch} branch?" if asked == "title" else f"Approve {ticket}?",
            tags={"branch": branch} if asked == "tags" else None,
            approvers=Approvers(principals=[f"{branch}-lead"]) if asked == "approvers" else None,
        )
        decision = yield approval
        yield ctx.run(do_branch, "applied", ticket)  # the same on both branches
        return {"branch": branch, "decision": decision}

    return wf


@pytest.mark.parametrize("asked", ["title", "tags", "approvers"])
def test_a_router_whose_question_changed_while_parked_is_nondeterminism_naming_both(
    asked: str,
) -> None:
    route: dict[str, Any] = {"branch": "human_review", "asked": asked}
    (step,) = resolved(record(asker(route), ["t-1"]), "r.0", "approved")
    digest = step.tags[TAG_ARGS]
    assert digest.startswith("v2:") and len(digest) == 3 + DIGEST_LENGTH
    # As the server stores it: with the title and approvers the human saw.
    question = Promise(
        id=step.id,
        state=step.state,
        param=step.param,
        value=step.value,
        tags=step.tags,
        create_time=step.create_time,
        settle_time=step.settle_time,
        title="Approve the human_review branch?" if asked == "title" else "Approve t-1?",
        approvers=Approvers(principals=["human_review-lead"]) if asked == "approvers" else None,
    )

    route["branch"] = "auto_reply"  # the selector's input changed while it waited
    with Engine(asker(route), ["t-1"], root_id="r", history=[question]) as engine:
        outcome = engine.advance()
    assert isinstance(outcome, Failed), outcome  # not auto_reply with human_review's approval
    error = outcome.error
    assert isinstance(error, NonDeterminismError)
    assert (error.position, error.step_id) == (0, "r.0")
    assert error.recorded is not None and error.yielded is not None
    assert error.recorded.startswith("promise with arguments title=")
    assert error.recorded.endswith(f"digest {digest}")
    assert error.yielded.startswith("promise with arguments title=")
    shown = {
        "title": ("title='Approve the human_review branch?'", "title='Approve the auto_reply"),
        "tags": ("tags={'branch': 'human_review'}", "tags={'branch': 'auto_reply'}"),
        "approvers": ("principals=('human_review-lead',)", "principals=('auto_reply-lead',)"),
    }
    assert shown[asked][0] in error.recorded and shown[asked][1] in error.yielded
    message = str(error)
    assert "step 0 ('r.0')" in message and shown[asked][0] in message
    assert CALLS == []

    route["branch"] = "human_review"  # put right: it replays on to the next step
    outcome = replay(asker(route), ["t-1"], [question], root_id="r")
    assert isinstance(outcome, CreateStep) and outcome.position == 1


def test_a_promise_digest_is_version_2_and_its_version_1_is_what_older_releases_recorded() -> None:
    asked = CreatePromise(title="Approve the human_review branch?")
    assert digest_version(asked) == 2
    assert args_digest(asked) == GOLDEN_PROMISE_V2  # pinned, as version 1's is
    # Version 1 (id, timeout, schema), the bare hex every release before recorded.
    v1 = canonical_json(["promise", None, None, None]).encode("ascii")
    assert args_digest(asked, 1) == hashlib.blake2b(v1, digest_size=8).hexdigest()
    assert args_digest(asked, 1) == args_digest(CreatePromise(title="other"), 1)
    assert args_digest(CreatePromise(check_args=False)) is None
    # Other commands' fields did not change: their digests stay version 1, bare.
    assert digest_version(RunStep(do_branch, ("human_review",))) == 1
    assert args_digest(RunStep(do_branch, ("human_review",))) == GOLDEN_HUMAN_REVIEW

    assert recorded_version("2116d4bf897f5cd3") == 1
    assert recorded_version(str(GOLDEN_PROMISE_V2)) == 2
    for unknown in ("v3:2116d4bf897f5cd3", "v1:2116d4bf897f5cd3", "x:2116d4bf897f5cd3",
                    "2116d4bf", "v2:2116D4BF897F5CD3", "v2:", ""):  # fmt: skip
        assert recorded_version(unknown) is None, unknown


def test_a_history_recorded_with_version_1_promise_digests_replays_as_before() -> None:
    # Recorded by a release before digest versions: a `troth:args` of id, timeout and schema.
    path = DIGESTS / "asker_v1.json"
    (history,) = load_histories(path)
    assert history.promises[0].tags[TAG_ARGS] == "2116d4bf897f5cd3"
    assert history.promises[0].title == "Approve the human_review branch?"
    route: dict[str, Any] = {"branch": "human_review"}
    (outcome,) = replay_file(path, {"asker": asker(route)})
    assert isinstance(outcome, CreateStep) and outcome.position == 1
    # Its title was not part of what it recorded: as before, it is not checked ...
    route["branch"] = "auto_reply"
    (outcome,) = replay_file(path, {"asker": asker(route)})
    assert isinstance(outcome, CreateStep) and outcome.position == 1

    # ... and what it recorded still is.
    def timed(ctx: Context, ticket: str) -> Gen:
        approval = yield ctx.promise(timeout=timedelta(days=1))
        return (yield approval)

    with pytest.raises(NonDeterminismError) as diverged:
        replay_file(path, {"asker": timed})
    assert diverged.value.recorded == (
        "promise with arguments title='Approve the human_review branch?', digest 2116d4bf897f5cd3"
    )
    assert diverged.value.yielded == "promise with arguments timeout=1 day, 0:00:00, digest " + str(
        args_digest(CreatePromise(timeout=timedelta(days=1)), 1)
    )


def test_a_digest_of_a_version_this_sdk_does_not_know_is_not_checked() -> None:
    route: dict[str, Any] = {"branch": "human_review"}
    recorded = resolved(record(asker(route), ["t-1"]), "r.0", "approved")
    newer = [
        Promise(
            id=p.id,
            state=p.state,
            param=p.param,
            value=p.value,
            tags={**p.tags, TAG_ARGS: "v3:0123456789abcdef"},
            create_time=p.create_time,
            settle_time=p.settle_time,
        )
        for p in recorded
    ]
    outcome = replay(asker(route), ["t-1"], newer, root_id="r")
    assert isinstance(outcome, CreateStep) and outcome.position == 1


# -- stable across processes -------------------------------------------------------

_COMMANDS = """
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from troth import Context
from troth._digests import args_digest

def do_branch(branch, ticket=""):
    return branch

ctx = Context("r")
commands = [
    ctx.run(do_branch, "human_review"),
    ctx.run(do_branch, {"b": [1, 2.5, None, True], "a": "é"}, frozenset({"x", "y", "z"})),
    ctx.run(do_branch, datetime(2025, 1, 1, tzinfo=UTC), Decimal("1.10"), b"\\x00\\xff",
            uuid.UUID(int=7)),
    ctx.promise(id="approval-1", timeout=timedelta(days=3), schema={"type": "object"}),
    ctx.start("child", 7, id="kid"),
    ctx.sleep(90),
]
"""


def _digests_in_subprocess(hash_seed: str) -> list[str | None]:
    code = _COMMANDS + "\nimport json\nprint(json.dumps([args_digest(c) for c in commands]))\n"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: list[str | None] = json.loads(done.stdout)
    return result


def test_digests_are_stable_across_interpreter_runs() -> None:
    # Two interpreters with different string hashes (set order differs), and this one.
    first = _digests_in_subprocess("1")
    second = _digests_in_subprocess("2")
    scope: dict[str, Any] = {}
    exec(_COMMANDS, scope)
    here = [args_digest(c) for c in scope["commands"]]
    assert first == second == here
    # A promise's is version 2 (`v2:` and the hex), the others' version 1 (the bare hex).
    assert all(d is not None and len(d.removeprefix("v2:")) == DIGEST_LENGTH for d in here)
    assert [d is not None and d.startswith("v2:") for d in here] == [
        False,
        False,
        False,
        True,
        False,
        False,
    ]
    assert len(set(here)) == len(here)
    # Pinned: a digest recorded by this release must match in every later one.
    assert here[0] == GOLDEN_HUMAN_REVIEW


def test_canonical_json_is_the_documented_encoding() -> None:
    assert canonical_json({"b": 1, "a": (1, 2)}) == '{"a":[1,2],"b":1}'
    assert canonical_json(["é"]) == '["\\u00e9"]'
    assert canonical_json(frozenset({"y", "x"})) == '["\\"x\\"","\\"y\\""]'
    assert canonical_json(timedelta(minutes=1)) == "60.0"
    assert canonical_json(Decimal("1.10")) == '"1.10"'
    assert canonical_json(uuid.UUID(int=1)) == '"00000000-0000-0000-0000-000000000001"'
    assert canonical_json(b"\x01") == '{"$bytes":"01"}'
    with pytest.raises(ValueError):
        canonical_json(float("inf"))


GOLDEN_HUMAN_REVIEW = "29a33d9c92a0cec5"
GOLDEN_PROMISE_V2 = "v2:b25502e5bef73dcd"


# -- what the CLI says -------------------------------------------------------------


def test_troth_replay_reports_a_digest_mismatch() -> None:
    route = {"branch": "human_review"}
    history = History(
        root_id="r",
        workflow="router",
        args=("t-1",),
        promises=tuple(resolved(record(router(route), ["t-1"]), "r.1", "approved")),
    )
    route["branch"] = "auto_reply"
    result = check_history(history, router(route), "file.json")
    assert result.divergence is not None
    digest = history.promises[0].tags[TAG_ARGS]
    assert render_result(result).startswith(
        f"history r (router): step 0 diverges: recorded run(do_branch) with arguments "
        f"digest {digest} (id r.0), the code now yields run(do_branch) with arguments "
        "('auto_reply',), digest "
    )


def test_a_settle_token_s_principal_is_checked_and_a_token_for_the_worker_keeps_its_digest() -> (
    None
):
    mine = SettleToken("wf.0", ("resolve",), timedelta(hours=1))
    before = canonical_json(["settle_token", "wf.0", ["resolve"], 3600.0]).encode("ascii")
    assert args_digest(mine) == hashlib.blake2b(before, digest_size=DIGEST_LENGTH // 2).hexdigest()
    for_bob = SettleToken("wf.0", ("resolve",), timedelta(hours=1), acts_for="bob")
    for_carol = SettleToken("wf.0", ("resolve",), timedelta(hours=1), acts_for="carol")
    assert len({args_digest(mine), args_digest(for_bob), args_digest(for_carol)}) == 3
