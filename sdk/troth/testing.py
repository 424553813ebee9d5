"""Helpers for testing your own workflows: replay without a server, or a real one.

`running_server` starts a real troth server (the `troth-server` distribution)
on a free port and a throw-away SQLite file, for integration tests of your
workers and gateways; no fake server is involved.

`replay` checks that a workflow's current code still matches a recorded
history (as Temporal's `Replayer` does): run it in your test suite against
histories recorded from production before you deploy a change. `troth export`
writes such histories from a live server, and `replay_file` (or, one at a
time, `load_histories` and `replay_history`) checks them::

    from myapp.worker import worker   # the Worker your workflows are registered on

    @pytest.mark.parametrize("path", sorted(Path("histories").glob("*.json")))
    def test_recorded_histories_still_replay(path):
        replay_file(path, worker)     # raises NonDeterminismError naming the step

`troth replay` does the same from the command line (see docs/workflows.md).

History files. `troth export` writes, and `load_histories` reads, JSON in
this shape; a file holds one such object, or a list of them::

    {"format": "troth.history/1",
     "workflow": "publish",
     "root_id": "publish-post-7",
     "args": ["post-7"],
     "root": {"id": "publish-post-7", "state": "PENDING",
              "tags": {"troth:invoke": "workers", "troth:func": "publish"},
              "param": ["post-7"]},
     "promises": [
        {"id": "publish-post-7.0", "state": "PENDING", "tags": {"troth:kind": "promise"}},
        {"id": "publish-post-7.1", "tags": {"troth:kind": "run", "troth:func": "send_email"},
         "value": "sent", "settle_time": "2025-01-01T00:00:00+00:00"}]}

- `workflow`: the name the workflow is registered under (the root's
  `troth:func` tag); `replay_file` and `troth replay` look the code up by it.
- `root_id` (default: `root.id`) and `args` (default: `root.param`, else `[]`).
- `root` (optional): the root promise. A root that is `REJECTED_CANCELED`
  replays as cancelled; one `RESOLVED` or `REJECTED` says the recorded run
  had ended, so code that now yields a step after the last recorded one
  diverges.
- `promises`: the root's steps, in any order (`troth export` reads them by
  record, `parent_id`; files from before it hold the `<root_id>.*` ids).

Each promise has `id`, `state` (default `RESOLVED`), `tags` (a step's
`troth:args`, its argument digest, is checked on replay when present; files
written before digests existed have none and are not checked), and optionally
`param`, `value`, `create_time`, `settle_time` (ISO 8601), `parent_id` (the
workflow whose step it is: a step with an explicit id is known by it), and a
`promise` step's `title` and `message` (named when it diverges). `param` and
`value` are plain JSON, encoded with the codec (default JSON); a payload that
is not JSON is written `{"$base64": "...", "headers": {...}}` and read back
byte for byte. Other keys (`expire_time`, `settled_by`, ...) are for people
and are ignored, and so is a missing `format` (files written by hand).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from troth._commands import TAG_FUNC, TAG_INVOKE
from troth._engine import (
    CreateStep,
    Done,
    Engine,
    Failed,
    Outcome,
    Suspend,
    Workflow,
    describe_tags,
)
from troth._promise import Promise, PromiseState
from troth.codec import Codec, JsonCodec, Payload
from troth.errors import ConfigurationError, NonDeterminismError
from troth.worker import Worker

if TYPE_CHECKING:
    from troth._credentials import TlsConfig

__all__ = [
    "HISTORY_FORMAT",
    "CreateStep",
    "Done",
    "Failed",
    "History",
    "Outcome",
    "Suspend",
    "load_histories",
    "load_history",
    "replay",
    "replay_file",
    "replay_history",
    "running_server",
]

HISTORY_FORMAT = "troth.history/1"
"""The `format` of the history files `troth export` writes."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BASE64 = "$base64"
_ENDED = (PromiseState.RESOLVED, PromiseState.REJECTED)
"""Root states that mean the recorded run of the workflow returned or raised."""


@dataclass(frozen=True, slots=True)
class History:
    """One workflow's recorded history, as a history file holds it (see the module docstring).

    Attributes:
        root_id: The workflow's id (its root promise's).
        workflow: The name the workflow is registered under; "" if the file names none.
        args: The workflow's arguments after `ctx`.
        promises: The root's steps the server held (see the module docstring).
        root: The root promise, if the history has it.

    .. versionadded:: 0.1.0
    """

    root_id: str
    workflow: str
    args: tuple[Any, ...]
    promises: tuple[Promise, ...]
    root: Promise | None = None


def replay(
    workflow: Workflow,
    args: Sequence[Any],
    history: Iterable[Promise],
    *,
    root_id: str,
    codec: Codec | None = None,
) -> Outcome:
    """Replay `workflow(ctx, *args)` against `history`; run nothing, create nothing.

    Returns the outcome where the recorded history runs out: `Done`/`Failed`
    if the workflow finishes, `Suspend` if it waits on a pending promise, or
    the `CreateStep` for the first step the history does not hold. No step
    function is ever called. The generator is closed before returning.

    Raises:
        NonDeterminismError: The code no longer yields what the history recorded.
    """
    return _replay(workflow, args, history, root_id=root_id, codec=codec)


def replay_history(history: History, workflow: Workflow, *, codec: Codec | None = None) -> Outcome:
    """Replay `workflow` against a loaded `History`; run nothing, create nothing.

    As `replay`, and also: when the history's root says the recorded run had
    ended (`RESOLVED` or `REJECTED`), code that now goes on to a step after
    the last recorded one diverges too (`NonDeterminismError` with
    `recorded=None`).

    Raises:
        NonDeterminismError: The code no longer yields what the history recorded.

    .. versionadded:: 0.1.0
    """
    return replay_history_counted(history, workflow, codec=codec)[0]


def replay_history_counted(
    history: History, workflow: Workflow, *, codec: Codec | None = None
) -> tuple[Outcome, int]:
    """`replay_history`, and how many recorded steps it replayed (for `troth replay`)."""
    root = history.root
    promises = (root, *history.promises) if root is not None else history.promises
    group = root.tags.get(TAG_INVOKE) if root is not None else None
    outcome, replayed = _replay_counted(
        workflow, history.args, promises, root_id=history.root_id, codec=codec, group=group
    )
    if (
        root is not None
        and root.state in _ENDED
        and isinstance(outcome, CreateStep)
        and not outcome.exists
        # A history exported by record (its steps carry parent_id) holds the
        # named steps too; an older one held only `<root>.*`, so there a step
        # with an explicit id it lacks is no evidence that the code changed.
        and (
            outcome.step_id.startswith(f"{history.root_id}.")
            or any(p.parent_id == history.root_id for p in history.promises)
        )
    ):
        raise NonDeterminismError(
            outcome.position,
            recorded=None,
            yielded=describe_tags(outcome.tags),
            step_id=outcome.step_id,
        )
    return outcome, replayed


def replay_file(
    path: str | PathLike[str],
    workflows: Worker | Mapping[str, Workflow],
    *,
    codec: Codec | None = None,
) -> list[Outcome]:
    """Replay every history in a history file against the workflow of its name.

    Args:
        path: A file `troth export` wrote (one history, or a list of them).
        workflows: The `Worker` the workflows are registered on, or a mapping
            from workflow name to workflow function.
        codec: Encodes the file's values as the server held them; default JSON.

    Returns:
        Each history's `Outcome` (see `replay_history`), in file order.

    Raises:
        NonDeterminismError: A history diverges from the code (the first one).
        ConfigurationError: A history names a workflow `workflows` does not have.
        OSError, ValueError: The file is missing, not JSON, or not a history.

    .. versionadded:: 0.1.0
    """
    registry = workflows.workflows if isinstance(workflows, Worker) else workflows
    outcomes = []
    for history in load_histories(path, codec=codec):
        workflow = registry.get(history.workflow)
        if workflow is None:
            known = ", ".join(sorted(registry)) or "none"
            raise ConfigurationError(
                f"{os.fspath(path)}: history {history.root_id!r} was recorded by workflow "
                f"{history.workflow!r}, which is not among the workflows given ({known}); "
                "pass the worker that registers it"
            )
        outcomes.append(replay_history(history, workflow, codec=codec))
    return outcomes


def _replay(
    workflow: Workflow,
    args: Sequence[Any],
    history: Iterable[Promise],
    *,
    root_id: str,
    codec: Codec | None,
    group: str | None = None,
) -> Outcome:
    return _replay_counted(workflow, args, history, root_id=root_id, codec=codec, group=group)[0]


def _replay_counted(
    workflow: Workflow,
    args: Sequence[Any],
    history: Iterable[Promise],
    *,
    root_id: str,
    codec: Codec | None,
    group: str | None = None,
) -> tuple[Outcome, int]:
    with Engine(
        workflow, args, root_id=root_id, history=history, codec=codec, group=group
    ) as engine:
        outcome = engine.advance()
        replayed = engine.replayed
    if isinstance(outcome, Failed) and isinstance(outcome.error, NonDeterminismError):
        raise outcome.error
    return outcome, replayed


def load_histories(
    source: str | PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    codec: Codec | None = None,
) -> list[History]:
    """Read the histories in a history file (a path), or in its parsed JSON.

    Raises:
        OSError: The file cannot be read.
        ValueError: It is not JSON (`json.JSONDecodeError`), or not histories
            in the shape of the module docstring (the message says what is wrong).

    .. versionadded:: 0.1.0
    """
    data: Any
    if isinstance(source, str | PathLike):
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    else:
        data = source
    encoder = codec or JsonCodec()
    if isinstance(data, Mapping):
        return [_history_from_json(data, encoder)]
    if isinstance(data, list | tuple):
        histories = []
        for index, item in enumerate(data):
            if not isinstance(item, Mapping):
                raise ValueError(f"item {index} is {_json_type(item)}, not a history object")
            try:
                histories.append(_history_from_json(item, encoder))
            except ValueError as exc:
                raise ValueError(f"item {index}: {exc}") from None
        return histories
    raise ValueError(f"the JSON is {_json_type(data)}; expected a history object or a list of them")


def load_history(
    source: str | PathLike[str] | Mapping[str, Any], *, codec: Codec | None = None
) -> tuple[str, list[Any], list[Promise]]:
    """Read a JSON history (a path or a parsed mapping): `(root_id, args, promises)`.

    `promises` includes the root when the history has it. For files of
    several histories, use `load_histories`.
    """
    histories = load_histories(source, codec=codec)
    if len(histories) != 1:
        raise ValueError(
            f"the file holds {len(histories)} histories, not one; read it with load_histories"
        )
    (history,) = histories
    root = [history.root] if history.root is not None else []
    return history.root_id, list(history.args), [*root, *history.promises]


def _history_from_json(data: Mapping[str, Any], codec: Codec) -> History:
    form = data.get("format", HISTORY_FORMAT)
    if form != HISTORY_FORMAT:
        raise ValueError(
            f"its format is {form!r}; this troth reads {HISTORY_FORMAT!r}: "
            "upgrade troth, or export the history again with this version"
        )
    root_json = data.get("root")
    root = _promise_from_json(root_json, codec, "root") if root_json is not None else None
    root_id = data.get("root_id", root.id if root is not None else None)
    if not isinstance(root_id, str) or not root_id:
        raise ValueError('it has no "root_id" (the workflow\'s id) and no "root"')
    if "args" in data:
        args = data["args"]
    elif root is not None:
        args = codec.decode(root.param)
    else:
        args = []
    if args is None:
        args = []
    if not isinstance(args, list):
        raise ValueError(f'history {root_id!r}: "args" is {_json_type(args)}, not a list')
    workflow = data.get("workflow", root.tags.get(TAG_FUNC, "") if root is not None else "")
    items = data.get("promises", [])
    if not isinstance(items, list):
        raise ValueError(f'history {root_id!r}: "promises" is {_json_type(items)}, not a list')
    promises = tuple(
        _promise_from_json(item, codec, f"promises[{index}]") for index, item in enumerate(items)
    )
    return History(root_id, str(workflow), tuple(args), promises, root)


def _promise_from_json(item: Any, codec: Codec, where: str) -> Promise:
    if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
        raise ValueError(f'{where} is not a promise object with an "id"')
    try:
        state = PromiseState(item.get("state", PromiseState.RESOLVED))
    except ValueError:
        names = ", ".join(PromiseState)
        raise ValueError(
            f"{where} ({item['id']}): state {item['state']!r} is not one of {names}"
        ) from None
    settled = state is not PromiseState.PENDING
    try:
        value = _payload(item["value"], codec) if settled and "value" in item else Payload()
        param = _payload(item["param"], codec) if "param" in item else Payload()
        settle_time = _time(item.get("settle_time"), "settle_time") if settled else None
        create_time = _time(item.get("create_time"), "create_time") or _EPOCH
        tags = {str(k): str(v) for k, v in item.get("tags", {}).items()}
        parent_id = str(item.get("parent_id", ""))
        title, message = str(item.get("title") or ""), str(item.get("message") or "")
    except (TypeError, ValueError, AttributeError, binascii.Error) as exc:
        raise ValueError(f"{where} ({item['id']}): {exc}") from None
    return Promise(
        id=item["id"],
        state=state,
        param=param,
        value=value,
        tags=tags,
        create_time=create_time,
        settle_time=settle_time,
        parent_id=parent_id,
        title=title,
        message=message,
    )


def _payload(value: Any, codec: Codec) -> Payload:
    """A value as the server held it: JSON through the codec, `$base64` byte for byte."""
    if isinstance(value, Mapping) and set(value) == {_BASE64, "headers"}:
        return Payload(
            headers={str(k): str(v) for k, v in value["headers"].items()},
            data=base64.b64decode(value[_BASE64], validate=True),
        )
    return codec.encode(value)


def _time(text: str | None, key: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(
            f"{key} {text!r} is not an ISO 8601 time, e.g. 2025-01-01T00:00:00Z"
        ) from None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


_AUTH_FLAGS = ("--no-auth", "--auth-tokens", "--jwt-key-file", "--jwt-jwks-file")


def _has_auth(args: Sequence[str]) -> bool:
    """Whether `troth serve` arguments choose authentication (else `--no-auth` is added:
    a server for tests on a loopback address)."""
    return any(arg.split("=", 1)[0] in _AUTH_FLAGS for arg in args)


@contextmanager
def running_server(
    *args: str, timeout: float = 30.0, tls: TlsConfig | None = None
) -> Iterator[str]:
    """Start `troth serve` on 127.0.0.1, a free port and a fresh SQLite file.

    Yields its address (`host:port`) once it accepts calls; stops it (SIGTERM)
    on exit. Extra `args` go to `troth serve` (e.g. `"--sweep-interval", "100ms"`,
    or `"--tls-cert", cert, "--tls-key", key` to serve TLS: then pass `tls`, the
    client settings the readiness check connects with, as your `Client` will).

    Raises:
        ConfigurationError: `troth-server` is not installed, or it did not start
            within `timeout` seconds (the message carries its log).

    .. versionadded:: 0.1.0
    """
    with tempfile.TemporaryDirectory(prefix="troth-test-") as workdir:
        port_file = Path(workdir) / "port"
        log_path = Path(workdir) / "server.log"
        command = [
            sys.executable, "-m", "troth_server", "serve", "--listen", "127.0.0.1:0",
            "--db", f"sqlite:///{Path(workdir) / 'troth.db'}", "--port-file", str(port_file),
            *(args if _has_auth(args) else ("--no-auth", *args)),
        ]  # fmt: skip
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=log, env=dict(os.environ))
        try:
            address = _wait_for_port(proc, port_file, log_path, timeout)
            _wait_until_serving(address, timeout, tls)
            yield address
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_for_port(
    proc: subprocess.Popen[bytes], port_file: Path, log_path: Path, timeout: float
) -> str:
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = log_path.read_text(errors="replace")
            if "No module named troth_server" in log:
                from troth._install import INSTALL_SERVER  # the CLI's words too

                raise ConfigurationError(
                    f"running_server needs the server, troth-server: {INSTALL_SERVER}"
                )
            proc.kill()
            raise ConfigurationError(f"the troth server did not start:\n{log[-4000:]}")
        time.sleep(0.02)
    return f"127.0.0.1:{int(port_file.read_text())}"


def _wait_until_serving(address: str, timeout: float, tls: TlsConfig | None) -> None:
    channel = (
        grpc.insecure_channel(address)
        if tls is None
        else grpc.secure_channel(address, tls.channel_credentials(), tls.channel_options())
    )
    with channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
