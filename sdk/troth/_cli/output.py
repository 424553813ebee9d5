"""What the `troth` command writes: JSON lines, `key: value` blocks and aligned tables.

Every command formats through here, so a promise, a task or a time reads the same
in every listing. With `--json`, stdout has one JSON object per line; payloads
appear decoded when they are JSON, else as `{"$base64": ..., "headers": {...}}`.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from troth._convert import datetime_from_proto
from troth._promise import CreateResult, Promise
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from troth._operators import TaskInfo
    from troth._promise import SettleResult
    from troth.codec import Payload

__all__ = [
    "TASK_KINDS",
    "TASK_STATES",
    "align",
    "emit_listing",
    "emit_promise",
    "emit_result",
    "first_line",
    "format_block",
    "format_table",
    "iso",
    "payload_preview",
    "payload_to_json",
    "promise_to_json",
    "task_info_to_json",
    "task_time",
    "task_to_json",
    "when",
    "write_json",
]

_PREVIEW_WIDTH = 40

TASK_KINDS = {tasks_pb2.TASK_KIND_INVOKE: "INVOKE", tasks_pb2.TASK_KIND_RESUME: "RESUME"}
TASK_STATES = {
    tasks_pb2.TASK_STATE_PENDING: "PENDING",
    tasks_pb2.TASK_STATE_CLAIMED: "CLAIMED",
    tasks_pb2.TASK_STATE_COMPLETED: "COMPLETED",
}


def write_json(obj: object, out: IO[str]) -> None:
    """One JSON object on its own line."""
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")


def emit_promise(promise: Promise, as_json: bool, out: IO[str]) -> None:
    """A promise as a JSON line or a `key: value` block."""
    if as_json:
        write_json(promise_to_json(promise), out)
    else:
        out.write(format_block(promise))


def emit_result(result: CreateResult | SettleResult, as_json: bool, out: IO[str]) -> None:
    """What a create or a settle did, then the promise."""
    promise = result.promise
    if isinstance(result, CreateResult):
        flag, happened = "created", result.created
        headline = (
            f"created {promise.id}"
            if happened
            else f"{promise.id} already existed; this create was a repeat and changed nothing"
        )
    else:
        flag, happened = "applied", result.applied
        headline = (
            f"{promise.id} is now {promise.state}"
            if happened
            else f"{promise.id} was already settled by this idempotency key; nothing changed"
        )
    if as_json:
        write_json({flag: happened, "promise": promise_to_json(promise)}, out)
    else:
        out.write(f"{headline}\n\n{format_block(promise)}")


def emit_listing(
    results: Iterable[Promise],
    limit: int,
    to_json: Callable[[Promise], object] | None,
    out: IO[str],
) -> list[Promise]:
    """Take at most `limit` (0: all) of `results`, writing each as a JSON line
    at once when `to_json` is given; say on stderr when more were left out."""
    shown: list[Promise] = []
    for promise in results:
        if limit and len(shown) == limit:
            print(f"showing the first {limit}; pass --limit 0 for all", file=sys.stderr)
            break
        if to_json is not None:
            write_json(to_json(promise), out)
        shown.append(promise)
    return shown


def payload_to_json(payload: Payload) -> Any:
    """A payload as a JSON-ready value: decoded JSON, None if empty, else base64 with a marker."""
    if not payload.data:
        return None
    if payload.is_json:
        try:
            return json.loads(payload.data)
        except ValueError:
            pass  # mislabelled: fall through to the lossless form
    return {
        "$base64": base64.b64encode(payload.data).decode("ascii"),
        "headers": dict(payload.headers),
    }


def promise_to_json(promise: Promise) -> dict[str, Any]:
    """A promise as a JSON-ready dict, field names as in the proto."""
    return {
        "id": promise.id,
        "state": promise.state.value,
        "param": payload_to_json(promise.param),
        "value": payload_to_json(promise.value),
        "tags": dict(promise.tags),
        "create_time": iso(promise.create_time),
        "settle_time": iso(promise.settle_time),
        "expire_time": iso(promise.expire_time),
        "idempotency_key_for_create": promise.idempotency_key_for_create,
        "idempotency_key_for_settle": promise.idempotency_key_for_settle,
        "settled_by": promise.settled_by,
        "schema": dict(promise.schema) if promise.schema is not None else None,
        "title": promise.title,
        "message": promise.message,
        "requested_by": promise.requested_by,
        "workflow_version": promise.workflow_version,
    }


def iso(moment: datetime | None) -> str | None:
    """A time as ISO 8601 in UTC with milliseconds (`...Z`), or None."""
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def when(moment: datetime | None, absent: str = "-") -> str:
    """A time for a table or block: `2030-01-02 03:04:05Z`, or `absent`."""
    if moment is None:
        return absent
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def payload_preview(payload: Payload, width: int | None = _PREVIEW_WIDTH) -> str:
    """One line showing a payload: compact JSON, or its size and type; cut to `width`."""
    if not payload.data:
        return "-"
    text: str | None = None
    if payload.is_json:
        try:
            text = json.dumps(json.loads(payload.data), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            text = None
    if text is None:
        kind = payload.content_type or "no content-type"
        text = f"<{len(payload.data)} bytes, {kind}>"
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def format_block(promise: Promise) -> str:
    """A `key: value` block describing one promise, ending in a newline."""
    tags = ", ".join(f"{k}={v}" for k, v in sorted(promise.tags.items())) or "-"
    rows = [
        ("id", promise.id),
        ("state", promise.state.value),
        ("param", payload_preview(promise.param, width=None)),
        ("value", payload_preview(promise.value, width=None)),
        ("tags", tags),
        ("created", when(promise.create_time)),
        ("expires", when(promise.expire_time, absent="never")),
        ("settled", when(promise.settle_time)),
        ("settled by", promise.settled_by or "-"),
        ("create key", promise.idempotency_key_for_create or "-"),
        ("settle key", promise.idempotency_key_for_settle or "-"),
    ]
    # Shown only when set: most promises are not waiting for a human.
    extra = [
        ("title", promise.title),
        ("message", promise.message),
        ("requested by", promise.requested_by),
        ("schema", json.dumps(promise.schema, separators=(",", ":")) if promise.schema else ""),
        ("version", promise.workflow_version),
    ]
    rows += [(label, value) for label, value in extra if value]
    width = max(len(label) for label, _ in rows) + 1
    return "".join(f"{label + ':':<{width}} {value}\n" for label, value in rows)


_COLUMNS = ("ID", "STATE", "CREATED", "EXPIRES", "SETTLED", "VALUE")


def format_table(promises: Iterable[Promise]) -> str:
    """Promises as an aligned table with a header, ending in a newline."""
    rows = [_COLUMNS] + [
        (
            p.id,
            p.state.value,
            when(p.create_time),
            when(p.expire_time, absent="never"),
            when(p.settle_time),
            payload_preview(p.value),
        )
        for p in promises
    ]
    return align(rows)


def align(rows: Sequence[Sequence[str]]) -> str:
    """Rows (the first a header) as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"


def first_line(text: str, width: int) -> str:
    """The first line of `text` (an error, a traceback), cut to `width` with `…`."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def task_time(task: tasks_pb2.Task, field: str) -> str | None:
    """One of a task's time fields as ISO 8601, or None when unset."""
    return iso(datetime_from_proto(getattr(task, field))) if task.HasField(field) else None


def task_to_json(task: tasks_pb2.Task) -> dict[str, Any]:
    """A task as a JSON-ready dict, field names as in the proto."""
    return {
        "id": task.id,
        "root_promise_id": task.root_promise_id,
        "group": task.group,
        "kind": TASK_KINDS.get(task.kind, "UNSPECIFIED"),
        "state": TASK_STATES.get(task.state, "UNSPECIFIED"),
        "counter": task.counter,
        "worker_id": task.worker_id or None,
        "lease_expire_time": task_time(task, "lease_expire_time"),
        "workflow": task.workflow or None,
        "workflow_version": task.workflow_version or None,
        "create_time": task_time(task, "create_time"),
        "waiting_for": task.waiting_for or None,
        "worker_principal": task.worker_principal or None,
        "failed_attempts": task.failed_attempts,
        "last_error": task.last_error or None,
        "last_traceback": task.last_traceback or None,
        "next_attempt_time": task_time(task, "next_attempt_time"),
        "version_absent_since": task_time(task, "version_absent_since"),
    }


def task_info_to_json(task: TaskInfo) -> dict[str, Any]:
    """A task as the SDK reads it (`Client.search_workflows`, `retry_workflow_now`), as
    `task_to_json` writes it: field names as in the proto."""
    return {
        "id": task.id,
        "root_promise_id": task.root_id,
        "group": task.group,
        "kind": task.kind.value,
        "state": task.state.value,
        "counter": task.counter,
        "worker_id": task.worker_id,
        "lease_expire_time": iso(task.lease_expire_time),
        "workflow": task.workflow,
        "workflow_version": task.workflow_version,
        "create_time": iso(task.create_time),
        "waiting_for": task.waiting_for,
        "worker_principal": task.worker_principal,
        "failed_attempts": task.failed_attempts,
        "last_error": task.last_error,
        "last_traceback": task.last_traceback,
        "next_attempt_time": iso(task.next_attempt_time),
        "version_absent_since": iso(task.version_absent_since),
    }
