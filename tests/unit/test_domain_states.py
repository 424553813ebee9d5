"""`domain.states`: an operator's rewrite of a workflow's state slot by
compare-and-swap, decided on what the write's transaction sees (pure): the run's end
wins over a worker holding its task, which wins over a moved version; only a parked
run at the expected version is written. Names and values are checked, naming the
field."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth_server.domain import states
from troth_server.domain import task as tasks
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.domain.states import Lost, LostTo, WorkflowState
from troth_server.domain.task import TaskKind

ROOT = Promise(
    id="w", state=PromiseState.PENDING, param=Payload(), value=Payload(), tags={}, create_time=0
)
SLOT = WorkflowState("w", "thread", 3, Payload({}, b"[1]"), 10, "workflow")
NEW = Payload({"content-type": "application/json"}, b"[2]")
PENDING_TASK = tasks.create("t", "w", "g", TaskKind.RESUME)
CLAIMED_TASK = tasks.claim(PENDING_TASK, "w1", 0, 30_000)


def test_a_parked_run_at_the_expected_version_is_written() -> None:
    for task in (None, PENDING_TASK):  # waiting on its steps, or a resume not yet claimed
        written = states.replace(SLOT, ROOT, task, 3, NEW, "ops", 99)
        assert written == WorkflowState("w", "thread", 4, NEW, 99, "ops")


@given(
    settled=st.booleans(),
    claimed=st.booleans(),
    expected=st.integers(min_value=0, max_value=6),
)
def test_what_a_rewrite_loses_to(settled: bool, claimed: bool, expected: int) -> None:
    root = _settled() if settled else ROOT
    outcome = states.replace(
        SLOT, root, CLAIMED_TASK if claimed else PENDING_TASK, expected, NEW, "ops", 99
    )
    if settled:
        assert isinstance(outcome, Lost) and outcome.to is LostTo.RUN_ENDED
    elif claimed:
        assert isinstance(outcome, Lost) and outcome.to is LostTo.TASK_CLAIMED
        assert "'w1'" in outcome.message
    elif expected != 3:
        assert isinstance(outcome, Lost) and outcome.to is LostTo.VERSION_CHANGED
        assert f"version 3 (written by workflow), not {expected}" in outcome.message
    else:
        assert isinstance(outcome, WorkflowState) and outcome.version == 4


def _settled() -> Promise:
    return replace(ROOT, state=PromiseState.RESOLVED, settle_time=5)


@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "é", "a/b"])
def test_a_bad_name_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        states.check_name(name, "state.name")
    assert refused.value.field == "state.name"


def test_a_value_that_says_json_must_be_json() -> None:
    assert states.check_value(Payload({"content-type": "application/json"}, b'{"a": 1}'))
    assert states.check_value(Payload({"content-type": "application/octet-stream"}, b"{"))
    with pytest.raises(InvalidArgument) as refused:
        states.check_value(Payload({"content-type": "application/json"}, b"{"))
    assert refused.value.field == "value"
