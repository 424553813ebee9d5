"""The worker of the human-in-the-loop example: the `publish` workflow.

A post is published only once an editor approves it. The workflow

1. creates a latent approval promise (durable, with a timeout) that nothing
   but a human's click settles,
2. sends the editors a notification carrying the approval links, as a
   checkpointed step: once recorded it is never sent again, however often the
   workflow replays or moves to another worker,
3. waits for the decision, for days if need be, costing no worker memory,
4. returns the decision: approved (and by whom), rejected, or timed out.

Only an editor may decide: the approval carries an approver policy
(`Approvers(principals=editors, not_requester=True)`): the server refuses a
settle by anyone else, and by the principal who started the workflow
(four eyes: an editor who asks to publish their own post cannot approve it).

Run it (see README.md):

    TROTH_SERVER=127.0.0.1:7070 OUTBOX=outbox.jsonl python worker.py

Settings, all from the environment:

- `TROTH_SERVER`: the troth server, host:port (default 127.0.0.1:7070).
- `TROTH_TOKEN`: the worker's bearer token (a token with role `worker` for the
  group), read by the SDK; unset when the server runs `--no-auth`.
- `TROTH_GROUP`: the worker group to serve (default `workers`).
- `OUTBOX`: the file the notifications are appended to, one JSON object a
  line, standing in for an email or chat service (default `outbox.jsonl`).
- `GATEWAY_URL`: where the approval links point (default http://127.0.0.1:8000).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Generator
from datetime import timedelta
from typing import Any

from troth import Approvers, Client, Context, PromiseRejectedError, PromiseTimedOutError, Worker

__all__ = [
    "APPROVAL_TAG",
    "DEFAULT_APPROVAL_TIMEOUT",
    "DEFAULT_EDITORS",
    "build_worker",
    "main",
    "publish",
]

_log = logging.getLogger("human_in_the_loop.worker")

APPROVAL_TAG = "publish-post"
"""The value of the `approval` tag on every approval promise; the gateway searches by it."""

DEFAULT_APPROVAL_TIMEOUT = timedelta(days=3).total_seconds()
"""How long an editor has to decide, in seconds, unless the start says otherwise."""

DEFAULT_EDITORS = ("alice", "bob")
"""The principals who may approve, unless the start names others (the gateway's `EDITORS`)."""


def send_notification(post_id: str, approval_id: str) -> dict[str, str]:
    """Tell the editors that `post_id` awaits approval: one JSON line appended to `OUTBOX`.

    Runs inside `ctx.run`, so its result is recorded on the step promise and a
    replay returns that record instead of sending again.
    """
    base = os.environ.get("GATEWAY_URL", "http://127.0.0.1:8000").rstrip("/")
    message = {
        "to": "editors",
        "subject": f"Post {post_id} is waiting for your approval",
        "post": post_id,
        "approval_id": approval_id,
        "approve": f"{base}/approvals/{approval_id}/approve",
        "reject": f"{base}/approvals/{approval_id}/reject",
    }
    with open(os.environ.get("OUTBOX", "outbox.jsonl"), "a", encoding="utf-8") as outbox:
        outbox.write(json.dumps(message) + "\n")
    _log.info("notified the editors about %s (approval %s)", post_id, approval_id)
    return message


def publish(
    ctx: Context,
    post_id: str,
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
    editors: list[str] | None = None,
) -> Generator[Any, Any, dict[str, Any]]:
    """Ask an editor to approve `post_id`, wait for the decision, and report it.

    Args:
        ctx: The workflow context.
        post_id: The post to publish.
        approval_timeout: Seconds the editors have to decide. It is an argument
            (recorded with the start) rather than a setting of the worker, so
            that every replay, on any worker, creates the same promise.
        editors: The principals who may decide (default `DEFAULT_EDITORS`);
            never the one who started the workflow.

    Returns:
        `{"post", "status", "approval_id", ...}` where `status` is `approved`
        (with the editor's `decision` and `approved_by`, the authenticated
        principal who approved), `rejected` (with the `decision`) or `timed_out`.
    """
    approval = yield ctx.promise(
        timeout=timedelta(seconds=approval_timeout),
        tags={"approval": APPROVAL_TAG, "post": post_id, "workflow": ctx.id},
        approvers=Approvers(principals=editors or DEFAULT_EDITORS, not_requester=True),
    )
    yield ctx.run(send_notification, post_id, approval.id)
    ctx.log.info("waiting for a decision on %s (approval %s)", post_id, approval.id)
    outcome: dict[str, Any] = {"post": post_id, "approval_id": approval.id}
    try:
        decision = yield ctx.decision(approval)  # the value, and who settled it
    except PromiseTimedOutError:
        return {**outcome, "status": "timed_out"}
    except PromiseRejectedError as rejected:
        return {**outcome, "status": "rejected", "decision": rejected.value}
    return {
        **outcome,
        "status": "approved",
        "decision": decision.value,
        "approved_by": decision.settled_by,
    }


def build_worker(client: Client, group: str = "workers") -> Worker:
    """A worker of `group` with the `publish` workflow registered."""
    worker = Worker(client, group=group)
    worker.workflow(publish)
    return worker


def main() -> None:
    """Serve the group until SIGINT or SIGTERM (then stop gracefully)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    address = os.environ.get("TROTH_SERVER", "127.0.0.1:7070")
    group = os.environ.get("TROTH_GROUP", "workers")
    with Client(address) as client:
        worker = build_worker(client, group)
        _log.info("worker for group %r of %s; Ctrl-C to stop", group, address)
        worker.run()


if __name__ == "__main__":
    main()
