"""History files, replaying them, and `troth replay` without a server.

The end-to-end run with a real server and worker is
tests/integration/test_replay_cli.py; here are the format, the messages, the
module lookup and the exit statuses, in process.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import uuid
from collections.abc import Generator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from troth import Context, JsonCodec, NonDeterminismError, Payload, Promise, PromiseState
from troth._cli import main
from troth._cli.replay import (
    CheckResult,
    UsageError,
    check_history,
    history_to_json,
    load_workflows,
    render_result,
)
from troth.errors import ConfigurationError
from troth.testing import (
    HISTORY_FORMAT,
    CreateStep,
    Done,
    History,
    Suspend,
    load_histories,
    load_history,
    replay_file,
    replay_history,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "histories"
EXPORTED = FIXTURES / "publish_exported.json"
CODEC = JsonCodec()
T0 = datetime(2025, 1, 1, tzinfo=UTC)
Gen = Generator[Any, Any, Any]


def send_email(promise_id: str) -> str:
    raise AssertionError("replay never runs a step")


def send_sms(promise_id: str) -> str:
    raise AssertionError("replay never runs a step")


def audit(post_id: str) -> str:
    raise AssertionError("replay never runs a step")


def publish(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    yield ctx.run(send_email, approval.id)
    decision = yield approval
    return {"post": post_id, "decision": decision}


def publish_sms(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    yield ctx.run(send_sms, approval.id)
    decision = yield approval
    return {"post": post_id, "decision": decision}


def publish_audited(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    yield ctx.run(send_email, approval.id)
    decision = yield approval
    yield ctx.run(audit, post_id)  # added after the last recorded step
    return {"post": post_id, "decision": decision}


def publish_short(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    return {"post": post_id, "decision": (yield approval)}


# -- the history format ----------------------------------------------------------


def test_an_exported_history_loads_with_its_name_root_and_raw_payloads() -> None:
    (history,) = load_histories(EXPORTED)
    assert (history.root_id, history.workflow, history.args) == (
        "publish-post-8",
        "publish",
        ("post-8",),
    )
    assert history.root is not None
    assert history.root.state is PromiseState.RESOLVED
    assert [p.id for p in history.promises] == ["publish-post-8.0", "publish-post-8.1"]
    approval, email = history.promises
    assert CODEC.decode(approval.value) == {"approved": True}
    assert approval.settle_time == datetime(2025, 1, 2, 9, 30, tzinfo=UTC)
    # Not JSON on the server, so written as $base64 and read back byte for byte.
    assert email.value == Payload({"content-type": "text/plain"}, b"sent")


def test_hand_written_histories_without_format_or_root_still_load() -> None:
    (history,) = load_histories(FIXTURES / "publish_suspended.json")
    assert (history.root_id, history.workflow, history.root) == ("publish-post-7", "publish", None)
    root_id, args, promises = load_history(FIXTURES / "publish_suspended.json")
    assert (root_id, args, len(promises)) == ("publish-post-7", ["post-7"], 2)


def promise(
    promise_id: str,
    state: PromiseState = PromiseState.RESOLVED,
    value: Payload | None = None,
    tags: dict[str, str] | None = None,
    param: Payload | None = None,
) -> Promise:
    settled = state is not PromiseState.PENDING
    return Promise(
        id=promise_id,
        state=state,
        param=param or Payload(),
        value=value or Payload(),
        tags=tags or {"troth:kind": "promise"},
        create_time=T0,
        settle_time=datetime(2025, 1, 1, 0, 0, 0, 123456, tzinfo=UTC) if settled else None,
    )


def test_what_export_writes_reads_back_as_the_server_held_it() -> None:
    root = promise(
        "wf-1",
        PromiseState.PENDING,
        tags={"troth:invoke": "workers", "troth:func": "publish"},
        param=CODEC.encode(["post-1"]),
    )
    steps = [
        promise("wf-1.0", PromiseState.PENDING),
        promise(
            "wf-1.1",
            value=Payload({"content-type": "application/octet-stream"}, b"\x00\xff"),
            tags={"troth:kind": "run", "troth:func": "send_email"},
        ),
    ]
    data = json.loads(json.dumps(history_to_json(root, steps)))
    assert data["format"] == HISTORY_FORMAT
    assert (data["workflow"], data["args"]) == ("publish", ["post-1"])

    (history,) = load_histories([data])
    assert history.root is not None
    assert (history.root.state, history.root.tags) == (root.state, root.tags)
    assert [(p.id, p.state, p.value, p.tags, p.settle_time) for p in history.promises] == [
        (p.id, p.state, p.value, p.tags, p.settle_time) for p in steps
    ]
    assert replay_history(history, publish) == Suspend(("wf-1.0",))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"root_id": "r", "promises": [}', "Expecting value"),
        ("[1]", "item 0 is a number, not a history object"),
        ('"text"', "the JSON is a string; expected a history object"),
        ('{"promises": []}', 'it has no "root_id"'),
        ('{"format": "troth.history/9", "root_id": "r"}', "upgrade troth"),
        ('{"root_id": "r", "args": {"a": 1}}', '"args" is an object, not a list'),
        ('{"root_id": "r", "promises": [{"id": "r.0", "state": "DONE"}]}', "is not one of"),
        (
            '{"root_id": "r", "promises": [{"state": "RESOLVED"}]}',
            'not a promise object with an "id"',
        ),
        (
            '{"root_id": "r", "promises": [{"id": "r.0", "settle_time": "yesterday"}]}',
            "promises[0] (r.0): settle_time 'yesterday' is not an ISO 8601 time",
        ),
    ],
)
def test_malformed_histories_say_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "h.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_histories(path)


# -- replaying -----------------------------------------------------------------


def test_replay_history_passes_the_code_that_recorded_it() -> None:
    (history,) = load_histories(EXPORTED)
    assert replay_history(history, publish) == Done(
        {"post": "post-8", "decision": {"approved": True}}
    )


def test_a_renamed_step_diverges_naming_position_and_both_commands() -> None:
    (history,) = load_histories(EXPORTED)
    with pytest.raises(NonDeterminismError) as raised:
        replay_history(history, publish_sms)
    error = raised.value
    assert (error.position, error.recorded, error.yielded, error.step_id) == (
        1,
        "run(send_email)",
        "run(send_sms)",
        "publish-post-8.1",
    )


def test_a_step_after_the_end_of_an_ended_run_diverges_but_not_of_one_in_flight() -> None:
    (ended,) = load_histories(EXPORTED)
    with pytest.raises(NonDeterminismError) as raised:
        replay_history(ended, publish_audited)
    assert (raised.value.position, raised.value.recorded, raised.value.yielded) == (
        2,
        None,
        "run(audit)",
    )
    # The same steps with the root still pending: the workflow was never
    # resumed yet, so running on to a new step is what it will do.
    assert ended.root is not None
    in_flight = History(
        ended.root_id,
        ended.workflow,
        ended.args,
        ended.promises,
        Promise(**{**_fields(ended.root), "state": PromiseState.PENDING, "settle_time": None}),
    )
    outcome = replay_history(in_flight, publish_audited)
    assert isinstance(outcome, CreateStep)
    assert (outcome.position, outcome.step_id) == (2, "publish-post-8.2")


def _fields(p: Promise) -> dict[str, Any]:
    return {name: getattr(p, name) for name in Promise.__dataclass_fields__}


def test_replay_file_looks_each_workflow_up_by_name(tmp_path: Path) -> None:
    assert replay_file(EXPORTED, {"publish": publish}) == [
        Done({"post": "post-8", "decision": {"approved": True}})
    ]
    with pytest.raises(NonDeterminismError):
        replay_file(EXPORTED, {"publish": publish_sms})
    with pytest.raises(ConfigurationError, match=r"'publish', which is not among .*ping"):
        replay_file(EXPORTED, {"ping": publish})


# -- what troth replay prints --------------------------------------------------------


def test_rendering_of_each_kind_of_divergence_and_of_success() -> None:
    (history,) = load_histories(EXPORTED)
    lines = [
        render_result(check_history(history, workflow))
        for workflow in (publish, publish_sms, publish_audited, publish_short)
    ]
    assert lines == [
        "history publish-post-8 (publish): OK, 2 steps replayed; the workflow returns",
        "history publish-post-8 (publish): step 1 diverges: recorded run(send_email) "
        "(id publish-post-8.1), the code now yields run(send_sms)",
        "history publish-post-8 (publish): step 2 diverges: recorded nothing there (the "
        "recorded run had ended: its root is RESOLVED), the code now yields run(audit) "
        "(id publish-post-8.2)",
        "history publish-post-8 (publish): step 1 diverges: recorded run(send_email) "
        "(id publish-post-8.1), the code now yields nothing there (it returns, raises or "
        "waits before reaching step 1)",
    ]


def test_rendering_of_where_a_replay_in_flight_stops() -> None:
    (history,) = load_histories(FIXTURES / "publish_suspended.json")
    result = check_history(history, publish, "f.json")
    assert (result.outcome, result.replayed) == (Suspend(("publish-post-7.0",)), 2)
    assert render_result(result) == (
        "history publish-post-7 (publish): OK, 2 steps replayed; it waits on publish-post-7.0"
    )
    # The count is what the replay reached, not what the file holds: rendered as given.
    assert render_result(CheckResult(history, "f.json", outcome=Suspend(("x",)), replayed=1)) == (
        "history publish-post-7 (publish): OK, 1 step replayed; it waits on x"
    )


# -- finding the workflow code ---------------------------------------------------------


WORKER_MODULE = """
from troth import Client, Worker

worker = Worker(Client("127.0.0.1:1"), group="w")

def send_email(promise_id):
    raise AssertionError("replay never runs a step")

@worker.workflow(name="publish")
def publish_v1(ctx, post_id):
    approval = yield ctx.promise()
    yield ctx.run(send_email, approval.id)
    decision = yield approval
    return {"post": post_id, "decision": decision}

def helper(ctx):
    yield ctx.sleep(1)

if __name__ == "__main__":
    raise SystemExit("a worker script's main block must not run on import")
"""

FUNCTIONS_MODULE = """
def send_sms(promise_id):
    raise AssertionError("replay never runs a step")

def publish(ctx, post_id):
    approval = yield ctx.promise()
    yield ctx.run(send_sms, approval.id)
    return (yield approval)

def not_a_workflow():
    return 1
"""


def write_module(directory: Path, code: str) -> str:
    """A module of a name no other test uses; returns that name."""
    name = f"wf_{uuid.uuid4().hex[:10]}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(textwrap.dedent(code))
    return name


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_a_module_file_gives_the_workflows_registered_on_its_worker(tmp_path: Path) -> None:
    name = write_module(tmp_path, WORKER_MODULE)
    registry = load_workflows([str(tmp_path / f"{name}.py")])
    assert list(registry) == ["publish"]  # the registered name, not the function's; no helper
    assert registry["publish"].__name__ == "publish_v1"


def test_a_module_without_a_worker_gives_its_generator_functions(tmp_path: Path) -> None:
    name = write_module(tmp_path / "pkg", FUNCTIONS_MODULE)
    registry = load_workflows([name], [str(tmp_path / "pkg")])
    assert sorted(registry) == ["publish"]


def test_a_module_in_the_current_directory_is_found_without_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = write_module(tmp_path, FUNCTIONS_MODULE)
    monkeypatch.chdir(tmp_path)
    assert sorted(load_workflows([name])) == ["publish"]


@pytest.mark.parametrize(
    ("attr", "expected"),
    [("worker", ["publish"]), ("publish_v1", ["publish_v1"]), ("table", ["custom"])],
)
def test_attr_names_a_worker_a_function_or_a_mapping(
    tmp_path: Path, attr: str, expected: list[str]
) -> None:
    name = write_module(tmp_path, WORKER_MODULE + "\ntable = {'custom': publish_v1}\n")
    assert sorted(load_workflows([f"{name}:{attr}"], [str(tmp_path)])) == expected


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        ("no_such_module_here", None, "no such module on the import path; give --path"),
        ("missing.py", None, "no such file: missing.py"),
        ("{name}", "import json\nraise RuntimeError('boom at import')\n", "boom at import"),
        ("{name}:nope", WORKER_MODULE, "has no 'nope'"),
        ("{name}:x", "x = 3\n", "x \\(of type int\\) is not a Worker"),
        ("{name}", "x = 3\n", "defines no Worker and no workflow"),
    ],
)
def test_unusable_workflow_modules_say_what_to_do(
    tmp_path: Path, spec: str, code: str | None, message: str
) -> None:
    name = write_module(tmp_path, code) if code is not None else ""
    with pytest.raises(UsageError, match=message):
        load_workflows([spec.format(name=name)], [str(tmp_path)])


def test_two_modules_giving_one_name_to_different_code_is_refused(tmp_path: Path) -> None:
    first = write_module(tmp_path, WORKER_MODULE)
    second = write_module(tmp_path, FUNCTIONS_MODULE)
    with pytest.raises(UsageError, match="workflow 'publish' is in both"):
        load_workflows([first, second], [str(tmp_path)])


# -- troth replay's exit statuses ---------------------------------------------------------


def replay_cli(*args: str) -> int:
    return main(["replay", *args])


def test_exit_0_when_every_history_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = write_module(tmp_path, WORKER_MODULE)
    assert replay_cli("--path", str(tmp_path), "--workflows", name, str(EXPORTED)) == 0
    out = capsys.readouterr().out
    assert "history publish-post-8 (publish): OK" in out
    assert out.endswith("1 history checked: 1 OK, 0 diverged\n")


def test_exit_1_and_one_json_object_per_history_when_one_diverges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = write_module(tmp_path, FUNCTIONS_MODULE)
    args = ("--json", "--path", str(tmp_path), "--workflows", name)
    assert replay_cli(*args, str(EXPORTED), str(FIXTURES / "publish_suspended.json")) == 1
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["history"], r["ok"]) for r in records] == [
        ("publish-post-8", False),
        ("publish-post-7", False),
    ]
    assert records[0]["divergence"] == {
        "position": 1,
        "step_id": "publish-post-8.1",
        "recorded": "run(send_email)",
        "yielded": "run(send_sms)",
    }
    assert records[0]["source"] == str(EXPORTED)


def test_a_directory_of_histories_is_read_file_by_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = write_module(tmp_path / "code", WORKER_MODULE)
    histories = tmp_path / "histories"
    histories.mkdir()
    for fixture in ("publish_exported.json", "publish_suspended.json", "publish_approved.json"):
        (histories / fixture).write_text((FIXTURES / fixture).read_text())
    assert replay_cli("--path", str(tmp_path / "code"), "--workflows", name, str(histories)) == 0
    assert "3 histories checked: 3 OK, 0 diverged" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("history", "message"),
    [
        (None, "no such file: {missing}"),
        ("{not json", "is not JSON (Expecting property name enclosed in double quotes at line 1"),
        ('{"root_id": "r", "workflow": "ship"}', "workflow 'ship', which the --workflows code"),
        ('{"root_id": "r"}', 'names no workflow (no "workflow" key'),
        ("[]", "no histories to check"),
    ],
)
def test_exit_2_when_nothing_could_be_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], history: str | None, message: str
) -> None:
    name = write_module(tmp_path, WORKER_MODULE)
    path = tmp_path / "history.json"
    if history is not None:
        path.write_text(history)
    else:
        path = tmp_path / "missing.json"
    assert replay_cli("--path", str(tmp_path), "--workflows", name, str(path)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message.format(missing=path) in captured.err
    assert captured.err.startswith("troth replay: error: ")


def test_exit_2_for_a_broken_workflow_module_or_no_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay_cli("--workflows", "no_such_module_here", str(EXPORTED)) == 2
    assert "cannot import module 'no_such_module_here'" in capsys.readouterr().err
    assert replay_cli("--workflows", "json") == 2
    assert "give history FILEs, --id or --search (one of them)" in capsys.readouterr().err
    assert replay_cli("--workflows", "json", "--tag", "a=b", str(EXPORTED)) == 2
    assert "--tag and --state filter a --search" in capsys.readouterr().err
    assert replay_cli(str(EXPORTED)) == 2  # --workflows is required
    assert "the following arguments are required: --workflows" in capsys.readouterr().err
