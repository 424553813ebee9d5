"""Which exceptions out of workflow code fail the workflow, and which only its task
(issue 12 item 5, `troth._failures`): pure, with the engine's own outcomes. A bug raised
while replaying is reported as itself, not as the non-determinism it also is (issue 27
item 5)."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from troth import (
    Cancelled,
    Client,
    Context,
    NonDeterminismError,
    PromiseRejectedError,
    PromiseTimedOutError,
    RegistrationError,
    Worker,
    WorkflowFailed,
)
from troth._engine import CreateStep, Engine, Failed, error_value
from troth._failures import (
    MAX_ERROR_CHARS,
    MAX_TRACEBACK_CHARS,
    describe_error,
    fails_workflow,
    format_traceback,
    log_paused,
    task_failure,
)
from troth.errors import timed_out


@pytest.fixture
def client() -> Iterator[Client]:
    with Client("127.0.0.1:1") as c:  # never contacted
        yield c


@pytest.mark.parametrize(
    ("error", "fail_on", "fails"),
    [
        (WorkflowFailed("refund refused"), (), True),
        (PromiseRejectedError("wf.0", {"reason": "no"}), (), True),  # a rejection, a failed step
        (timed_out("wf.0", "timed out"), (), True),
        (Cancelled("wf"), (), True),
        (ValueError("bad order"), (ValueError,), True),
        (KeyError("k"), (LookupError,), True),  # declared by a base class
        # Bugs: the task fails and is retried; the root stays PENDING.
        (NameError("name 'x' is not defined"), (), False),
        (ValueError("bad order"), (KeyError,), False),
        (TypeError("unsupported operand"), (), False),
        (NonDeterminismError(0, "run(a)", "run(b)", "wf.0"), (), False),
    ],
)
def test_only_declared_and_troth_outcomes_fail_the_workflow(
    error: Exception, fail_on: tuple[type[BaseException], ...], fails: bool
) -> None:
    assert fails_workflow(error, fail_on) is fails


def test_the_timeout_a_step_raises_is_the_servers_class() -> None:
    assert isinstance(timed_out("wf.0", "m"), PromiseTimedOutError)


def test_workflow_failed_rejects_with_its_message_and_travels_between_processes() -> None:
    error = WorkflowFailed("refund refused", {"order": 7})
    assert str(error) == "refund refused"
    assert error_value(error) == {
        "type": "troth.errors.WorkflowFailed",
        "message": "refund refused",
    }
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.message, copy.details) == ("refund refused", {"order": 7})


def _raise(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_describe_error_names_the_type_and_message_within_the_servers_limit() -> None:
    assert describe_error(NameError("name 'x' is not defined")) == (
        "NameError: name 'x' is not defined"
    )
    assert describe_error(WorkflowFailed("no")) == "troth.errors.WorkflowFailed: no"
    assert describe_error(RuntimeError()) == "RuntimeError"
    long = describe_error(ValueError("x" * 10_000))
    assert len(long) == MAX_ERROR_CHARS and long.endswith("...")


def test_the_traceback_keeps_its_innermost_part_when_too_long() -> None:
    try:
        # A cause with a huge message first: the traceback's end is the raise.
        raise NameError("name 'typo' is not defined") from ValueError("v" * 40_000)
    except NameError as exc:
        text = format_traceback(exc)
    assert len(text) <= MAX_TRACEBACK_CHARS
    assert text.startswith("... (traceback cut")
    assert text.rstrip().endswith("NameError: name 'typo' is not defined")
    short = format_traceback(_raise(KeyError("k")))
    assert short.startswith("Traceback (most recent call last):")
    assert format_traceback(NonDeterminismError(0, "a", "b")) == ""


def with_a_typo(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.now()
    return undefined_name  # type: ignore[name-defined]  # noqa: F821


def test_the_engine_answers_a_bug_with_failed_carrying_its_traceback() -> None:
    engine = Engine(with_a_typo, root_id="wf")
    step = engine.advance()
    outcome = engine.advance([_settled_now(step)])
    assert isinstance(outcome, Failed) and isinstance(outcome.error, NameError)
    assert not fails_workflow(outcome.error)
    assert "return undefined_name" in format_traceback(outcome.error)


SETTINGS: dict[str, str] = {}


def reads_a_setting(ctx: Context) -> Generator[Any, Any, Any]:
    prefix = SETTINGS["prefix"]  # a KeyError where the deploy lacks the setting
    when = yield ctx.now()
    return f"{prefix} {when}"


def declares(ctx: Context) -> Generator[Any, Any, Any]:
    if "prefix" not in SETTINGS:
        raise ValueError("no prefix")  # declared: fail_on=(ValueError,)
    yield ctx.now()
    return SETTINGS["prefix"]


def _recorded_first_step(workflow: Any) -> Any:
    SETTINGS["prefix"] = "blog"
    try:
        with Engine(workflow, root_id="wf") as engine:
            step = engine.advance()
            assert isinstance(step, CreateStep)
            return _settled_now(step)
    finally:
        SETTINGS.clear()


def test_a_bug_raised_while_replaying_before_a_recorded_step_is_reported_as_itself() -> None:
    history = [_recorded_first_step(reads_a_setting)]
    with Engine(reads_a_setting, root_id="wf", history=history) as engine:
        outcome = engine.advance()
    assert isinstance(outcome, Failed)
    error = outcome.error
    # Non-determinism still (the code did not reach its recorded step), naming the exception.
    assert isinstance(error, NonDeterminismError)
    assert (error.position, error.step_id, error.raised) == (0, "wf.0", "KeyError: 'prefix'")
    assert isinstance(error.__cause__, KeyError)
    assert "nothing (it raised KeyError: 'prefix' before reaching it)" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.raised, str(copy)) == (error.raised, str(error))
    # What the task reports: the bug itself, with its own traceback.
    named, text, trace = task_failure(error)
    assert named is error.__cause__ and text == "KeyError: 'prefix'"
    assert trace.startswith(
        "raised while replaying, before the code reached recorded step 0 ('wf.0'), now\n"
        "Traceback (most recent call last):"
    )
    assert 'prefix = SETTINGS["prefix"]' in trace
    # A declared failure raised there cannot be the run's outcome: the first execution
    # went past that point. It is reported as the non-determinism, naming it.
    declared = [_recorded_first_step(declares)]
    with Engine(declares, root_id="wf", history=declared) as engine:
        outcome = engine.advance()
    assert isinstance(outcome, Failed) and isinstance(outcome.error, NonDeterminismError)
    assert not fails_workflow(outcome.error, (ValueError,))
    named, text, trace = task_failure(outcome.error, (ValueError,))
    assert named is outcome.error
    assert text.startswith("troth.errors.NonDeterminismError: ")
    assert "it raised ValueError: no prefix before reaching it" in text
    assert 'raise ValueError("no prefix")' in trace  # the raise, for whoever reads it


def test_a_bug_raised_on_a_first_run_and_a_task_failure_outside_the_code() -> None:
    bug = _raise(NameError("name 'x' is not defined"))
    named, text, trace = task_failure(bug)
    assert named is bug and text == "NameError: name 'x' is not defined"
    assert trace.startswith("Traceback (most recent call last):")
    codec = _raise(TypeError("JsonCodec cannot encode 'set' values"))
    named, text, trace = task_failure(codec, where="encoding the result")
    assert named is codec
    assert text == "TypeError: JsonCodec cannot encode 'set' values"
    assert trace.startswith("encoding the result\nTraceback (most recent call last):")
    plain = NonDeterminismError(1, "run(a)", "run(b)", "wf.1")
    assert task_failure(plain) == (plain, describe_error(plain), "")


def _settled_now(step: Any) -> Any:
    from datetime import UTC, datetime

    from troth import Promise, PromiseState
    from troth.codec import JsonCodec

    return Promise(
        id=step.step_id,
        state=PromiseState.RESOLVED,
        param=step.param,
        value=JsonCodec().encode(datetime.now(UTC).isoformat()),
        tags=dict(step.tags),
        create_time=datetime.now(UTC),
        settle_time=datetime.now(UTC),
    )


def test_fail_on_is_registered_with_the_workflow(client: Client) -> None:
    worker = Worker(client, group="g")

    @worker.workflow(fail_on=(ValueError, KeyError))
    def strict(ctx: Context) -> Generator[Any, Any, None]:
        yield ctx.now()

    @worker.workflow(fail_on=ValueError)
    def one(ctx: Context) -> Generator[Any, Any, None]:
        yield ctx.now()

    assert worker.registrations["strict"].fail_on == (ValueError, KeyError)
    assert worker.registrations["one"].fail_on == (ValueError,)
    with pytest.raises(RegistrationError, match=r"fail_on='ValueError': give exception types"):
        worker.workflow(fail_on="ValueError")(with_a_typo)  # type: ignore[call-overload]
    with pytest.raises(RegistrationError, match="give exception types"):
        worker.workflow(name="other", fail_on=(ValueError, int))(with_a_typo)  # type: ignore[call-overload]


def test_a_paused_attempt_is_logged_once_at_error_with_its_traceback_and_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("troth.worker")
    with caplog.at_level(logging.INFO, logger="troth.worker"):
        log_paused(
            log, _raise(NameError("name 'x' is not defined")), workflow_id="wf", task_id="t1",
            attempt=3, version="9efa4b1f6d27", worker_id="w",
        )  # fmt: skip
        log_paused(
            log, NonDeterminismError(0, "run(a)", "run(b)"), workflow_id="wf", task_id="t1",
            attempt=4, version="", worker_id="w",
        )  # fmt: skip
        log_paused(
            log, _raise(NameError("name 'y' is not defined")), workflow_id="wf", task_id="t1",
            attempt=5, version="", worker_id="w", where="step 'wf.2' (notify) failed 3 times",
        )  # fmt: skip
    first, second, third = caplog.records
    assert "raised NameError: name 'y' is not defined (step 'wf.2' (notify) failed 3 times)" in (
        third.getMessage()
    )
    assert first.levelno == second.levelno == logging.ERROR
    message = first.getMessage()
    assert "workflow 'wf' (task t1, attempt 3) raised NameError" in message
    assert "compatible=('9efa4b1f6d27',)" in message
    assert "troth workflows fail wf --reason" in message
    assert first.exc_info is not None and first.exc_info[0] is NameError
    assert second.exc_info is None  # non-determinism: its message names everything
    assert "fix the code and deploy it, or fail it" in second.getMessage()
