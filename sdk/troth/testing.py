"""Helpers for testing your own workflows, without a server.

`replay` checks that a workflow's current code still matches a recorded
history (as Temporal's `Replayer` does): run it in your test suite against
histories recorded from production before you deploy a change.

`load_history` reads a history from JSON, in this shape (values are plain
JSON, encoded with the JSON codec; `state` defaults to `RESOLVED`)::

    {"root_id": "publish-post-7", "args": ["post-7"],
     "promises": [
        {"id": "publish-post-7.0", "state": "PENDING", "tags": {"troth:kind": "promise"}},
        {"id": "publish-post-7.1", "tags": {"troth:kind": "run", "troth:func": "send_email"},
         "value": "sent", "settle_time": "2025-01-01T00:00:00+00:00"}]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any

from troth._engine import CreateStep, Done, Engine, Failed, Outcome, Suspend, Workflow
from troth._promise import Promise, PromiseState
from troth.codec import Codec, JsonCodec, Payload
from troth.errors import NonDeterminismError

__all__ = ["CreateStep", "Done", "Failed", "Outcome", "Suspend", "load_history", "replay"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    with Engine(workflow, args, root_id=root_id, history=history, codec=codec) as engine:
        outcome = engine.advance()
    if isinstance(outcome, Failed) and isinstance(outcome.error, NonDeterminismError):
        raise outcome.error
    return outcome


def load_history(
    source: str | PathLike[str] | Mapping[str, Any], *, codec: Codec | None = None
) -> tuple[str, list[Any], list[Promise]]:
    """Read a JSON history (a path or a parsed mapping): `(root_id, args, promises)`."""
    data: Mapping[str, Any]
    if isinstance(source, Mapping):
        data = source
    else:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    encoder = codec or JsonCodec()
    promises = [_promise_from_json(item, encoder) for item in data.get("promises", [])]
    return str(data["root_id"]), list(data.get("args", [])), promises


def _promise_from_json(item: Mapping[str, Any], codec: Codec) -> Promise:
    state = PromiseState(item.get("state", PromiseState.RESOLVED))
    settled = state is not PromiseState.PENDING
    value = codec.encode(item["value"]) if settled and "value" in item else Payload()
    settle_time = item.get("settle_time")
    return Promise(
        id=str(item["id"]),
        state=state,
        param=codec.encode(item["param"]) if "param" in item else Payload(),
        value=value,
        tags={str(k): str(v) for k, v in item.get("tags", {}).items()},
        create_time=_time(item.get("create_time")) or _EPOCH,
        settle_time=_time(settle_time) if settled else None,
    )


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
