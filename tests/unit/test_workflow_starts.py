"""Workflow starts and lifetimes, pure: when a start of an existing id is a repeat
(`domain.starts`), a workflow's default lifetime (`--default-workflow-ttl`), and the
warning for a step its workflow's expiry cut short (`troth._lifetimes`)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from troth import Context
from troth._commands import CreatePromise, Sleep, StartWorkflow
from troth._digests import args_digest, canonical_json
from troth._engine import CreateStep
from troth._lifetimes import cut_short
from troth._promise import Promise as SdkPromise
from troth._promise import PromiseState as SdkState
from troth.codec import Payload as SdkPayload
from troth.errors import Reason
from troth.v1 import promises_pb2
from troth_server.api._convert import create_request
from troth_server.config import Limits, settings_from
from troth_server.domain import promise as domain
from troth_server.domain.errors import PromiseAlreadyExists
from troth_server.domain.promise import CreateRequest, Payload, PromiseState
from troth_server.domain.starts import WorkflowAlreadyExists

T0 = 1_767_225_600_000
DAY_MS = 86_400_000
ARGS = Payload({"content-type": "application/json"}, b'["post-7"]')
START = CreateRequest(
    id="w-7",
    param=ARGS,
    tags={"troth:invoke": "workers", "troth:func": "publish"},
    ttl=30 * DAY_MS,
)


def started(request: CreateRequest = START) -> domain.Promise:
    promise, created = domain.create(None, request, T0)
    assert created
    return promise


# -- repeats ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "repeat",
    [
        pytest.param(START, id="the same start"),
        pytest.param(replace(START, ttl=DAY_MS), id="another ttl"),
        pytest.param(replace(START, idempotency_key="k2"), id="a key the first did not carry"),
        pytest.param(
            replace(START, tags={**START.tags, "team": "news"}), id="other tags than the two"
        ),
    ],
)
def test_a_start_with_the_same_workflow_group_and_arguments_is_a_repeat(
    repeat: CreateRequest,
) -> None:
    first = started()
    again, created = domain.create(first, repeat, T0 + 5)
    assert (again, created) == (first, False)


def test_the_original_key_gets_the_run_whatever_the_start_says() -> None:
    first = started(replace(START, idempotency_key="req-1"))
    other = replace(
        START,
        param=Payload({}, b'["post-8"]'),
        tags={"troth:invoke": "elsewhere", "troth:func": "approve"},
        idempotency_key="req-1",
    )
    assert domain.create(first, other, T0 + 5) == (first, False)


def test_a_settled_run_is_answered_as_it_ended() -> None:
    first = started()
    done = replace(first, state=PromiseState.RESOLVED, settle_time=T0 + 1)
    assert domain.create(done, START, T0 + 5) == (done, False)


@pytest.mark.parametrize(
    ("change", "differences", "phrases"),
    [
        (
            {"tags": {"troth:invoke": "workers", "troth:func": "approve"}},
            ("workflow",),
            ["already exists as 'publish' (this start names 'approve')"],
        ),
        (
            {"tags": {"troth:invoke": "editors", "troth:func": "publish"}},
            ("group",),
            ["as 'publish' in group 'workers' (this start names 'editors')"],
        ),
        (
            {"param": Payload({"content-type": "application/json"}, b'["post-8"]')},
            ("arguments",),
            ["already exists as 'publish' with other arguments"],
        ),
        (
            {"param": Payload(), "tags": {"troth:invoke": "x", "troth:func": "publish"}},
            ("group", "arguments"),
            ["in group 'workers' (this start names 'x'), with other arguments"],
        ),
    ],
)
def test_another_workflow_group_or_arguments_is_refused_naming_the_difference(
    change: dict[str, object], differences: tuple[str, ...], phrases: list[str]
) -> None:
    first = started(replace(START, idempotency_key="req-1"))
    for key in (None, "req-2"):  # no key, or not the original one
        with pytest.raises(WorkflowAlreadyExists) as caught:
            domain.create(first, replace(START, idempotency_key=key, **change), T0 + 5)  # type: ignore[arg-type]
        error = caught.value
        assert error.reason is Reason.WORKFLOW_ALREADY_EXISTS
        assert isinstance(error, PromiseAlreadyExists)  # ALREADY_EXISTS, as any taken id
        assert error.differences == differences
        assert error.metadata == {
            "promise_id": "w-7",
            "workflow": "publish",
            "differences": ",".join(differences),
        }
        assert error.message.startswith("workflow 'w-7' already exists as 'publish' ")
        for phrase in phrases:
            assert phrase in error.message
        # It says what to do.
        assert "use another id" in error.message
        assert "pass the original start's idempotency key" in error.message


def test_a_start_of_a_plain_promise_id_is_refused_saying_so() -> None:
    plain, _ = domain.create(None, CreateRequest(id="w-7", param=ARGS, tags={}), T0)
    with pytest.raises(PromiseAlreadyExists, match="is a promise, not a workflow") as caught:
        domain.create(plain, START, T0 + 5)
    assert caught.value.reason is Reason.ALREADY_EXISTS


def test_plain_creates_keep_their_rules() -> None:
    """A create without troth:invoke is compared as before: same key, or no keys and
    identical param and tags, even over a workflow root."""
    first = started()
    plain = CreateRequest(id="w-7", param=ARGS, tags={"troth:func": "publish"})
    with pytest.raises(PromiseAlreadyExists, match="different param or tags"):
        domain.create(first, plain, T0 + 5)


# -- the default lifetime ---------------------------------------------------------------


def test_a_workflow_lives_30_days_by_default_a_promise_one() -> None:
    limits = Limits()
    assert limits.default_workflow_ttl_ms == 30 * DAY_MS
    start = promises_pb2.CreatePromiseRequest(id="w", tags={"troth:invoke": "workers"})
    plain = promises_pb2.CreatePromiseRequest(id="p")
    assert create_request(start, limits).ttl == 30 * DAY_MS
    assert create_request(plain, limits).ttl == DAY_MS
    given = promises_pb2.CreatePromiseRequest(id="w", tags={"troth:invoke": "workers"})
    given.ttl.FromTimedelta(timedelta(hours=2))
    assert create_request(given, limits).ttl == 2 * 3_600_000
    forever = promises_pb2.CreatePromiseRequest(
        id="w", tags={"troth:invoke": "workers"}, never_expires=True
    )
    assert create_request(forever, limits).ttl is None


def test_the_default_workflow_lifetime_is_a_flag_within_max_ttl() -> None:
    assert settings_from(["--default-workflow-ttl", "90d"], {}).limits.default_workflow_ttl_ms == (
        90 * DAY_MS
    )
    env = {"TROTH_DEFAULT_WORKFLOW_TTL": "2d"}
    assert settings_from([], env).limits.default_workflow_ttl_ms == 2 * DAY_MS
    # The 30-day default gives way to a shorter --max-ttl; an explicit one may not.
    assert settings_from(["--max-ttl", "7d"], {}).limits.default_workflow_ttl_ms == 7 * DAY_MS
    with pytest.raises(SystemExit):
        settings_from(["--max-ttl", "7d", "--default-workflow-ttl", "8d"], {})
    request = promises_pb2.CreatePromiseRequest(id="w", tags={"troth:invoke": "workers"})
    assert create_request(request, Limits(max_ttl_ms=DAY_MS)).ttl == DAY_MS


# -- the warning for a step cut short ---------------------------------------------------

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def step_promise(expire_in: timedelta, state: SdkState = SdkState.PENDING) -> SdkPromise:
    return SdkPromise(
        id="w-7.0",
        state=state,
        param=SdkPayload(),
        value=SdkPayload(),
        tags={},
        create_time=NOW,
        expire_time=NOW + expire_in,
        root_id="w-7",
        parent_id="w-7",
    )


def step(command: CreatePromise | Sleep | StartWorkflow, ttl: timedelta | None) -> CreateStep:
    return CreateStep("w-7.0", 0, command, {}, SdkPayload(), ttl)


@pytest.mark.parametrize(
    ("command", "asked"),
    [
        (CreatePromise(timeout=timedelta(days=3)), "a timeout of 3d"),
        (Sleep(duration=timedelta(days=3)), "a sleep of 3d"),
        (StartWorkflow(name="child", ttl=timedelta(days=3)), "a ttl of 3d"),
    ],
)
def test_a_step_cut_short_by_its_workflow_is_named_with_both(
    command: CreatePromise | Sleep | StartWorkflow, asked: str
) -> None:
    warning = cut_short(step(command, timedelta(days=3)), step_promise(timedelta(days=1)))
    assert warning is not None
    assert f"step 'w-7.0' asked for {asked}, but workflow 'w-7' expires at " in warning
    assert "2030-01-03T03:04:05Z (in 1d)" in warning
    assert "start the workflow with a longer ttl" in warning


@pytest.mark.parametrize(
    ("ttl", "expire_in", "state"),
    [
        (timedelta(days=3), timedelta(days=3), SdkState.PENDING),  # as asked
        (timedelta(days=3), timedelta(days=3, microseconds=-900), SdkState.PENDING),  # rounded
        (None, timedelta(days=1), SdkState.PENDING),  # asked nothing: the default
        (timedelta(days=3), timedelta(days=1), SdkState.RESOLVED),  # an early answer
    ],
)
def test_no_warning_when_nothing_asked_was_cut(
    ttl: timedelta | None, expire_in: timedelta, state: SdkState
) -> None:
    command = CreatePromise(timeout=ttl)
    assert cut_short(step(command, ttl), step_promise(expire_in, state)) is None


def test_a_childs_ttl_is_in_its_digest_only_when_given() -> None:
    plain = StartWorkflow(name="child", args=(1,))
    # The digest every start recorded before ttls: histories replay unchanged.
    before = hashlib.blake2b(canonical_json(["start", "child", [1], None]).encode(), digest_size=8)
    assert args_digest(plain) == before.hexdigest()
    week = args_digest(StartWorkflow(name="child", args=(1,), ttl=timedelta(days=7)))
    assert week not in (None, args_digest(plain))
    assert week != args_digest(StartWorkflow(name="child", args=(1,), ttl=timedelta(days=8)))


def test_ctx_start_takes_a_positive_timedelta() -> None:
    ctx = Context("w-7")
    assert ctx.start("child", ttl=timedelta(days=7)).ttl == timedelta(days=7)
    assert ctx.rpc("child", ttl=timedelta(hours=1)).ttl == timedelta(hours=1)
    assert ctx.start("child").ttl is None
    with pytest.raises(TypeError, match=r"ctx\.start: ttl must be a timedelta .*, not int 3600"):
        ctx.start("child", ttl=3600)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl must be positive"):
        ctx.rpc("child", ttl=timedelta(0))
