"""`troth tasks list` without a server: parsing and output (tests/integration/test_versions.py
runs it against one)."""

from __future__ import annotations

import pytest

from troth._cli import build_parser, main
from troth._cli.tasks import cmd_list, format_tasks, task_to_json
from troth.v1 import tasks_pb2

CREATED = 1_893_553_445  # 2030-01-02T03:04:05Z


def pending(root: str, waiting: str, version: str = "") -> tasks_pb2.Task:
    task = tasks_pb2.Task(
        id=f"t-{root}",
        root_promise_id=root,
        group="workers",
        kind=tasks_pb2.TASK_KIND_RESUME,
        state=tasks_pb2.TASK_STATE_PENDING,
        workflow="publish",
        workflow_version=version,
        waiting_for=waiting,
    )
    task.create_time.seconds = CREATED
    return task


def test_tasks_list_parses_its_group_limit_and_the_global_flags() -> None:
    args = build_parser().parse_args(["tasks", "list", "--group", "workers", "--json"])
    assert (args.group, args.limit, args.json, args.handler) == ("workers", 100, True, cmd_list)
    args = build_parser().parse_args(["--json", "tasks", "list", "--group", "g", "--limit", "5"])
    assert (args.group, args.limit, args.json) == ("g", 5, True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tasks", "list"], "the following arguments are required: --group"),
        (["tasks", "list", "--group", "g", "--limit", "0"], "use a number from 1 to 1000"),
        (["tasks", "list", "--group", "g", "--limit", "5000"], "use a number from 1 to 1000"),
        (["tasks"], "required: ACTION"),
    ],
)
def test_bad_tasks_command_lines_exit_2_saying_why(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_table_shows_the_worker_of_a_claimed_task_and_why_a_pending_one_waits() -> None:
    claimed = tasks_pb2.Task(
        root_promise_id="publish-1",
        kind=tasks_pb2.TASK_KIND_INVOKE,
        state=tasks_pb2.TASK_STATE_CLAIMED,
        workflow="publish",
        workflow_version="9efa4b1f6d27",
        worker_id="host-1-abc",
    )
    claimed.create_time.seconds = CREATED
    waiting = pending("publish-2", "waiting for a worker of group 'workers' ...", "3c0d2b8e41aa")
    assert format_tasks([claimed, waiting]) == (
        "ROOT       KIND    STATE    WORKFLOW  VERSION       CREATED                   "
        "WORKER / WAITING FOR\n"
        "publish-1  INVOKE  CLAIMED  publish   9efa4b1f6d27  2030-01-02 03:04:05.000Z  "
        "host-1-abc\n"
        "publish-2  RESUME  PENDING  publish   3c0d2b8e41aa  2030-01-02 03:04:05.000Z  "
        "waiting for a worker of group 'workers' ...\n"
    )


def test_json_output_names_fields_as_the_proto_does() -> None:
    assert task_to_json(pending("publish-2", "waiting", "v1")) == {
        "id": "t-publish-2",
        "root_promise_id": "publish-2",
        "group": "workers",
        "kind": "RESUME",
        "state": "PENDING",
        "counter": 0,
        "worker_id": None,
        "lease_expire_time": None,
        "workflow": "publish",
        "workflow_version": "v1",
        "create_time": "2030-01-02T03:04:05.000Z",
        "waiting_for": "waiting",
        "worker_principal": None,
        "failed_attempts": 0,
        "last_error": None,
        "last_traceback": None,
        "next_attempt_time": None,
        "version_absent_since": None,
    }


def test_a_failed_task_shows_its_attempts_last_error_and_retry_time() -> None:
    ok = pending("publish-1", "waiting for a free worker", "v1")
    failed = pending("publish-2", "", "v1")
    failed.failed_attempts = 3
    failed.last_error = "NameError: name 'aproval' is not defined"
    failed.last_traceback = "Traceback (most recent call last):\n  ...\nNameError: ..."
    failed.next_attempt_time.seconds = CREATED + 4
    assert format_tasks([ok, failed]) == (
        "ROOT       KIND    STATE    WORKFLOW  VERSION  CREATED                   "
        "WORKER / WAITING FOR               ATTEMPTS  LAST ERROR\n"
        "publish-1  RESUME  PENDING  publish   v1       2030-01-02 03:04:05.000Z  "
        "waiting for a free worker          -         -\n"
        "publish-2  RESUME  PENDING  publish   v1       2030-01-02 03:04:05.000Z  "
        "retry at 2030-01-02 03:04:09.000Z  3         NameError: name 'aproval' is not defined\n"
    )
    shown = task_to_json(failed)
    assert shown["failed_attempts"] == 3
    assert shown["last_error"] == "NameError: name 'aproval' is not defined"
    assert shown["last_traceback"].startswith("Traceback")
    assert shown["next_attempt_time"] == "2030-01-02T03:04:09.000Z"
