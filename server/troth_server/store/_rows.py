"""Rows to records and back: promises and tasks as the store's statements read them.

Pure conversions (no connection): `to_row` for the promise write statements,
`to_promise`/`to_task` for whatever a select returns, and the JSON columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from troth_server.domain.approvers import Approvers
from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.domain.routing import workflow_name
from troth_server.domain.starts import INVOKE_TAG
from troth_server.domain.task import Task, TaskKind, TaskState

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["dump_json", "load_json", "to_promise", "to_row", "to_task"]


def to_task(row: Any) -> Task:
    return Task(
        id=row["id"],
        root_promise_id=row["root_promise_id"],
        group=row["group"],
        kind=TaskKind(row["kind"]),
        state=TaskState(row["state"]),
        counter=row["counter"],
        worker_id=row["worker_id"],
        lease_expire_time=row["lease_expire_time"],
        lease_ms=row["lease_ms"],
        preferred_worker_id=row["preferred_worker_id"],
        resume_pending=bool(row["resume_pending"]),
        workflow=row["workflow"],
        workflow_version=row["workflow_version"],
        create_time=row["create_time"],
        complete_time=row["complete_time"],
        worker_principal=row["worker_principal"],
        failed_attempts=row["failed_attempts"] or 0,
        last_error=row["last_error"],
        last_traceback=row["last_traceback"],
        next_attempt_time=row["next_attempt_time"],
    )


def to_row(p: Promise) -> dict[str, Any]:
    return {
        "id": p.id,
        "state": p.state.value,
        "param_headers": dump_json(p.param.headers),
        "param_data": p.param.data,
        "value_headers": dump_json(p.value.headers),
        "value_data": p.value.data,
        "tags": dump_json(p.tags),
        "timer": p.is_timer,
        "create_time": p.create_time,
        "settle_time": p.settle_time,
        "expire_time": p.expire_time,
        "idempotency_key_for_create": p.idempotency_key_for_create,
        "idempotency_key_for_settle": p.idempotency_key_for_settle,
        "settled_by": p.settled_by,
        "schema": p.schema,
        "title": p.title,
        "message": p.message,
        "requested_by": p.requested_by,
        "workflow_version": p.workflow_version,
        "root_id": p.root_id,
        "parent_id": p.parent_id,
        "approvers": None if p.approvers is None else p.approvers.to_json(),
        "started_by": p.started_by,
        "settle_token_id": p.settle_token_id,
        "instance": p.instance,
        # Copies of a workflow root's tags, for the index that lists workflows.
        "workflow_group": p.tags.get(INVOKE_TAG),
        "workflow_name": workflow_name(p.tags) if INVOKE_TAG in p.tags else None,
    }


def dump_json(value: Mapping[str, str]) -> str:
    return orjson.dumps(value).decode() if value else "{}"


def load_json(value: Any) -> dict[str, str]:
    # TEXT on SQLite; a driver may hand JSON columns over already decoded.
    if isinstance(value, str | bytes):
        return orjson.loads(value) if value != "{}" else {}
    return dict(value)


# Rows in `promises.c` order, whether from a Core select or from the compiled
# statements: seq, id, state, param_headers, param_data, value_headers,
# value_data, tags, timer, create_time, settle_time, expire_time,
# idempotency_key_for_create, idempotency_key_for_settle, settled_by, schema,
# title, message, requested_by, workflow_version, root_id, parent_id, approvers,
# started_by, settle_token_id, instance.
def to_promise(row: Sequence[Any]) -> Promise:
    return Promise(
        id=row[1],
        state=PromiseState(row[2]),
        param=Payload(load_json(row[3]), bytes(row[4])),
        value=Payload(load_json(row[5]), bytes(row[6])),
        tags=load_json(row[7]),
        create_time=row[9],
        settle_time=row[10],
        expire_time=row[11],
        idempotency_key_for_create=row[12],
        idempotency_key_for_settle=row[13],
        settled_by=row[14],
        schema=row[15],
        title=row[16],
        message=row[17],
        requested_by=row[18],
        workflow_version=row[19],
        root_id=row[20],
        parent_id=row[21],
        approvers=None if row[22] is None else Approvers.from_json(row[22]),
        started_by=row[23],
        settle_token_id=row[24],
        instance=row[25],
    )
