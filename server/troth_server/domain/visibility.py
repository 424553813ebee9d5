"""What a principal sees of a promise it may read (DESIGN §7, issue 11 part 2).

Pure: `view` answers from the promise, the reader's `Principal`, and, for a
workflow's step, the task group of the workflow that wrote it. Every read path
of the api layer (GetPromise, SearchPromises, the watches, the create and settle
answers, Poll's history) passes its promises through it.

- `idempotency_key_for_create`: to its writer (the creator of a top-level promise,
  recorded as `started_by`; for a workflow's step, a worker of the workflow's group)
  and to admins;
- `idempotency_key_for_settle`: to its writer (`settled_by`; for a step, a worker of
  the workflow's group) and to admins;
- the value of a `settle_token` step (the token a workflow mails in a link): to a
  worker of the workflow's group and to admins.

Others get the keys empty and the token step's value replaced by an empty
payload with the header `troth-redacted: settle_token`.

A workflow's task, as a workflow listing shows it (`SearchWorkflows`), is whole only
to a principal that may read tasks (`SearchTasks`: operators and admins): its last
error and traceback quote the workflow's code and data, and its fence (worker,
principal, counter) is the worker's. Others see its state, kind, attempts, next
retry and why it waits (`sees_task_details`). A create or settle
answer also shows the key the call itself sent: it is the caller's own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from troth_server.domain.access import Role, may_call
from troth_server.domain.promise import Payload
from troth_server.domain.steps import KIND_TAG

if TYPE_CHECKING:
    from troth_server.domain.access import Principal
    from troth_server.domain.promise import Promise

SETTLE_TOKEN_KIND = "settle_token"
"""The `troth:kind` of a step whose value is a settle token (`approval.settle_token`)."""
REDACTED_HEADER = "troth-redacted"
"""Header of a payload the reader may not see: its value names what was withheld."""
REDACTED_TOKEN = Payload({REDACTED_HEADER: SETTLE_TOKEN_KIND}, b"")


def needs_group(promise: Promise, reader: Principal) -> bool:
    """Whether `view` of this promise for `reader` depends on its workflow's group
    (only a worker's view of a step does: nobody else may work for a group)."""
    return (
        promise.parent_id is not None
        and Role.ADMIN not in reader.roles
        and Role.WORKER in reader.roles
        and bool(reader.groups)
    )


def is_token_step(promise: Promise) -> bool:
    return promise.parent_id is not None and promise.tags.get(KIND_TAG) == SETTLE_TOKEN_KIND


def view(
    promise: Promise,
    reader: Principal,
    group: str | None = None,
    *,
    sent_key: str | None = None,
) -> Promise:
    """`promise` as `reader` may see it. `group` is the task group of the workflow
    whose step it is (None if unknown or not a step); `sent_key` the idempotency key
    the call being answered carried."""
    if Role.ADMIN in reader.roles:
        return promise
    workers = promise.parent_id is not None and group is not None and reader.may_work_for(group)
    create_key = promise.idempotency_key_for_create
    if create_key is not None and not (
        workers
        or create_key == sent_key
        or (promise.parent_id is None and promise.started_by == reader.name)
    ):
        create_key = None
    settle_key = promise.idempotency_key_for_settle
    if settle_key is not None and not (
        workers or settle_key == sent_key or promise.settled_by == reader.name
    ):
        settle_key = None
    value = promise.value
    if not workers and is_token_step(promise) and value.data:
        value = REDACTED_TOKEN
    if (
        create_key == promise.idempotency_key_for_create
        and settle_key == promise.idempotency_key_for_settle
        and value is promise.value
    ):
        return promise
    return replace(
        promise,
        idempotency_key_for_create=create_key,
        idempotency_key_for_settle=settle_key,
        value=value,
    )


def sees_task_details(reader: Principal) -> bool:
    """Whether `reader` sees a task whole (its error, traceback and fence) where a
    workflow listing carries it: only if it may read tasks at all (`SearchTasks`)."""
    return may_call(reader, "SearchTasks")
