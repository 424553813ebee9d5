"""`troth workflows show|fail` without a server: parsing and what `show` says of a task
(tests/integration/test_bug_pauses.py runs both against one)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from troth import Payload, Promise, PromiseState
from troth._cli import build_parser, main
from troth._cli.workflows import format_task
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    import pytest

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
ROOT = Promise(
    id="publish-7",
    state=PromiseState.PENDING,
    param=Payload(),
    value=Payload(),
    tags={"troth:invoke": "workers", "troth:func": "publish"},
    create_time=NOW,
)


def test_workflows_commands_parse_their_id_and_reason() -> None:
    args = build_parser().parse_args(["workflows", "fail", "publish-7", "--reason", "typo"])
    assert (args.command, args.action, args.id, args.reason) == (
        "workflows",
        "fail",
        "publish-7",
        "typo",
    )
    assert build_parser().parse_args(["workflows", "show", "publish-7", "--json"]).json


def test_fail_without_a_reason_exits_2_saying_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflows", "fail", "publish-7"]) == 2
    assert "--reason" in capsys.readouterr().err


def test_show_tells_why_a_failing_workflow_does_not_move_and_what_to_do() -> None:
    task = tasks_pb2.Task(
        id="t1",
        kind=tasks_pb2.TASK_KIND_RESUME,
        state=tasks_pb2.TASK_STATE_PENDING,
        failed_attempts=3,
        last_error="NameError: name 'decison' is not defined",
        last_traceback='Traceback (most recent call last):\n  File "wf.py"\nNameError: ...\n',
    )
    task.next_attempt_time.FromDatetime(datetime(2030, 1, 2, 3, 4, 9))
    assert format_task(task, ROOT) == (
        "task:      RESUME PENDING (t1)\n"
        "attempts:  3 failed\n"
        "retry at:  2030-01-02 03:04:09Z\n"
        "error:     NameError: name 'decison' is not defined\n"
        "The workflow stays pending: deploy fixed code to resume it from its checkpoints, "
        "or run `troth workflows fail publish-7 --reason TEXT`.\n"
        "traceback:\n"
        "  Traceback (most recent call last):\n"
        '    File "wf.py"\n'
        "  NameError: ...\n"
    )
    assert format_task(None, ROOT) == "task: none now (the workflow waits on its steps)\n"
