"""The HTTP gateway of the human-in-the-loop example (FastAPI, served by uvicorn).

It is what a web app does with troth: start a workflow by id, show what
waits for a human, settle a human's decision by promise id, show the outcome.
It holds no state of its own: everything lives on the troth server.

    POST /posts/{post_id}/publish[?wait=SECONDS]  start workflow `publish-{post_id}` (once; a
                                                repeat with another timeout is 409); with
                                                `wait`, answer once its editor was notified
    GET  /posts/{post_id}[?wait=SECONDS]        its state, and its result once finished
    GET  /approvals                             the approvals waiting for a decision
                                                (with a bearer token: those its holder may decide)
    POST /approvals/{promise_id}/approve        approve (body: {"reviewer", "comment"}, optional)
    POST /approvals/{promise_id}/reject         reject  (same body)

A second click on approve or reject answers 409 with how, when and by whom
the approval was settled; send the same `Idempotency-Key` header to make a
retried click succeed instead (`applied: false`).

Who decides: a request carrying `Authorization: Bearer <troth token>` is made
to troth in that token's name (the editor's, or for a start the author's), so
the server checks the approval's approver policy against the human who
clicked and records them as `settled_by`. Without one, the gateway's own token
is used, which the policy refuses for approve and reject (403).

Against a server run `--no-auth` there are no tokens: a request names its person
with an `X-Troth-Principal: alice` header instead, which the gateway passes on as
the SDK's `principal=` (gRPC metadata `troth-principal`, which such a server records
and checks the policy against). A gateway that has a token of its own (the server
checks credentials, and ignores that metadata) refuses the header (401).

Run it (see README.md):

    TROTH_SERVER=127.0.0.1:7070 uvicorn gateway:app --port 8000

Settings, from the environment: `TROTH_SERVER` (default 127.0.0.1:7070),
`TROTH_GROUP` (default `workers`), `TROTH_TOKEN` (the gateway's own token, role
`gateway`), `EDITORS` (comma-separated principals who may approve; default
`alice,bob`), `TROTH_PRINCIPAL` (with `--no-auth` only: the name recorded for
the gateway's own calls, default `gateway`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from troth import (
    AlreadyExistsError,
    AlreadySettledError,
    Client,
    ConfigurationError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    Promise,
    PromiseState,
    PromiseTimedOutError,
    RpcError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = ["app", "create_app"]

_log = logging.getLogger("human_in_the_loop.gateway")

WORKFLOW = "publish"
"""The workflow's registered name (the function `publish` in worker.py)."""

APPROVAL_TAG = "publish-post"
"""The `approval` tag the workflow puts on its approval promises (worker.APPROVAL_TAG)."""

DEFAULT_APPROVAL_TIMEOUT = timedelta(days=3).total_seconds()
MAX_APPROVAL_TIMEOUT = timedelta(days=365).total_seconds()
WORKFLOW_SLACK = timedelta(hours=1)
"""How long the workflow may run past its approval's timeout (its root ttl covers both)."""

_OUTCOMES = {
    PromiseState.PENDING: "pending",
    PromiseState.RESOLVED: "approved",
    PromiseState.REJECTED: "rejected",
    PromiseState.REJECTED_CANCELED: "canceled",
    PromiseState.REJECTED_TIMEDOUT: "timed_out",
}


class StartRequest(BaseModel):
    """Optional body of `POST /posts/{post_id}/publish`."""

    approval_timeout_seconds: float = Field(
        default=DEFAULT_APPROVAL_TIMEOUT, gt=0, le=MAX_APPROVAL_TIMEOUT
    )


class DecisionRequest(BaseModel):
    """Optional body of approve / reject."""

    reviewer: str | None = None
    comment: str | None = None


class ApprovalView(BaseModel):
    id: str
    post: str | None
    workflow_id: str | None
    state: PromiseState
    outcome: str
    created_at: datetime
    expires_at: datetime | None
    settled_at: datetime | None
    settled_by: str | None
    approvers: list[str] = Field(default_factory=list)
    decision: Any = None
    approve_url: str
    reject_url: str


class WorkflowView(BaseModel):
    post: str
    workflow_id: str
    state: PromiseState
    started_at: datetime
    finished_at: datetime | None
    result: Any = None
    error: Any = None
    approval: ApprovalView | None = None


class SettledView(BaseModel):
    applied: bool
    approval: ApprovalView


class ConflictView(BaseModel):
    detail: str
    reason: str
    approval: ApprovalView


def workflow_id(post_id: str) -> str:
    """The workflow's id: starting it twice with the same id starts it once."""
    return f"publish-{post_id}"


MAX_CALLER_CLIENTS = 64
"""Connections kept open for callers' tokens (one per token, the oldest closed first)."""


def create_app(address: str | None = None, group: str | None = None) -> FastAPI:
    """The gateway app, talking to the troth server at `address` (default `TROTH_SERVER`)."""
    address = address or os.environ.get("TROTH_SERVER", "127.0.0.1:7070")
    client = Client(address, principal=os.environ.get("TROTH_PRINCIPAL", "gateway"))
    group = group or os.environ.get("TROTH_GROUP", "workers")
    editors = [e.strip() for e in os.environ.get("EDITORS", "alice,bob").split(",") if e.strip()]
    has_token = bool(os.environ.get("TROTH_TOKEN") or os.environ.get("TROTH_TOKEN_FILE"))
    callers: dict[tuple[str, str], Client] = {}

    def caller(kind: str, who: str) -> Client:
        if (kind, who) not in callers:
            if len(callers) >= MAX_CALLER_CLIENTS:
                callers.pop(next(iter(callers))).close()
            made = Client(address, token=who) if kind == "token" else Client(address, principal=who)
            callers[kind, who] = made
        return callers[kind, who]

    def client_for(authorization: str | None, principal: str | None = None) -> Client:
        """The caller's own client when it sent a bearer token (or, against a `--no-auth`
        server, named itself with `X-Troth-Principal`), else the gateway's."""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise ConfigurationError("the Authorization header must be 'Bearer <troth token>'")
            return caller("token", token.strip())
        if principal and principal.strip():
            if has_token:
                raise ConfigurationError(
                    "X-Troth-Principal names the person only against a server run --no-auth; "
                    "this gateway has a token, so send 'Authorization: Bearer <troth token>'"
                )
            return caller("principal", principal.strip())
        return client

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        client.close()
        for caller in callers.values():
            caller.close()

    app = FastAPI(title="troth human-in-the-loop gateway", lifespan=lifespan)

    # The SDK's errors, as HTTP answers: a client's mistake is never a 500.
    @app.exception_handler(ConfigurationError)
    async def bad_credentials(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "reason": "CREDENTIALS_MALFORMED"}, 401)

    @app.exception_handler(RpcError)
    async def rpc_error(request: Request, exc: Exception) -> JSONResponse:
        status = 502
        if isinstance(exc, UnauthenticatedError):
            status = 401
        elif isinstance(exc, PermissionDeniedError):
            status = 403
        elif isinstance(exc, NotFoundError):
            status = 404
        elif isinstance(exc, AlreadyExistsError):
            status = 409  # e.g. a start of a post already started with another timeout
        elif isinstance(exc, InvalidArgumentError):
            status = 422
        elif isinstance(exc, UnavailableError):
            status = 503
        elif isinstance(exc, DeadlineExceededError):
            status = 504
        reason = exc.reason if isinstance(exc, RpcError) else ""
        return JSONResponse({"detail": str(exc), "reason": reason}, status_code=status)

    def approval_view(promise: Promise) -> ApprovalView:
        decision = None if promise.value.is_empty else client.decode(promise.value)
        return ApprovalView(
            id=promise.id,
            post=promise.tags.get("post"),
            workflow_id=promise.tags.get("workflow"),
            state=promise.state,
            outcome=_OUTCOMES[promise.state],
            created_at=promise.create_time,
            expires_at=promise.expire_time,
            settled_at=promise.settle_time,
            settled_by=promise.settled_by or None,
            approvers=list(promise.approvers.principals) if promise.approvers else [],
            decision=decision,
            approve_url=f"/approvals/{promise.id}/approve",
            reject_url=f"/approvals/{promise.id}/reject",
        )

    def workflow_view(post_id: str, root: Promise) -> WorkflowView:
        found = client.search(tags={"approval": APPROVAL_TAG, "workflow": root.id}, page_size=1)
        view = WorkflowView(
            post=post_id,
            workflow_id=root.id,
            state=root.state,
            started_at=root.create_time,
            finished_at=root.settle_time,
            approval=approval_view(found.promises[0]) if found.promises else None,
        )
        if root.state is PromiseState.RESOLVED:
            view.result = client.decode(root.value)
        elif root.is_settled:
            view.error = {"state": root.state, "value": client.decode(root.value)}
        return view

    def notified(post_id: str, timeout: float) -> Promise:
        """The workflow's root once it waits for its editor (the approval asked for and the
        notification step recorded: step 1 of worker.py's `publish`), once it ended, or
        once `timeout` seconds passed, whichever comes first."""
        deadline = time.monotonic() + timeout
        while True:
            root = client.get(workflow_id(post_id))
            if root.is_settled or time.monotonic() > deadline:
                return root
            try:
                if client.get(f"{root.id}.1").is_settled:
                    return root
            except NotFoundError:
                pass
            time.sleep(0.05)

    @app.post("/posts/{post_id}/publish", status_code=202)
    def start_publish(
        post_id: str,
        body: StartRequest | None = None,
        authorization: Annotated[str | None, Header()] = None,
        x_troth_principal: Annotated[str | None, Header()] = None,
        wait: Annotated[float, Query(ge=0, le=60)] = 0,
    ) -> WorkflowView:
        """Start the approval workflow of a post; a repeat returns the same execution (a
        start of it with another approval timeout is 409, saying what differs).
        With the author's bearer token, the author is its starter: four eyes then
        keep them from approving their own post. With `wait`, first wait up to that
        many seconds until the editor was notified (the approval is then pending)."""
        timeout = (body or StartRequest()).approval_timeout_seconds
        handle = client_for(authorization, x_troth_principal).start(
            WORKFLOW,
            post_id,
            timeout,
            editors,
            id=workflow_id(post_id),
            group=group,
            ttl=timedelta(seconds=timeout) + WORKFLOW_SLACK,
        )
        _log.info("%s workflow %s", "started" if handle.created else "found", handle.id)
        return workflow_view(post_id, notified(post_id, wait) if wait else handle.get())

    @app.get("/posts/{post_id}")
    def get_post(post_id: str, wait: Annotated[float, Query(ge=0, le=60)] = 0) -> WorkflowView:
        """The workflow's state; with `wait`, first wait up to that many seconds for it to end."""
        handle = client.handle(workflow_id(post_id))
        root = handle.get()
        if wait and not root.is_settled:
            try:
                root = client.wait(handle.id, timeout=wait)
            except DeadlineExceededError:
                root = handle.get()
        return workflow_view(post_id, root)

    @app.get("/approvals")
    def list_approvals(
        authorization: Annotated[str | None, Header()] = None,
        x_troth_principal: Annotated[str | None, Header()] = None,
    ) -> list[ApprovalView]:
        """The approvals waiting for a decision, oldest first; with a bearer token,
        only those its holder may decide (the server checks each approver policy)."""
        decider = client_for(authorization, x_troth_principal)
        pending = decider.search_all(
            tags={"approval": APPROVAL_TAG},
            states=[PromiseState.PENDING],
            mine=decider is not client,
        )
        return [approval_view(promise) for promise in pending]

    def settle(
        promise_id: str,
        approve: bool,
        body: DecisionRequest | None,
        key: str | None,
        authorization: str | None,
        principal: str | None,
    ) -> SettledView | JSONResponse:
        # Only approval promises may be settled here: never a workflow's root or
        # another of its steps, whatever id the caller sends.
        if client.get(promise_id).tags.get("approval") != APPROVAL_TAG:
            return JSONResponse(
                {"detail": f"{promise_id!r} is not an approval", "reason": "NOT_FOUND"},
                status_code=404,
            )
        decision = {"approved": approve, **(body or DecisionRequest()).model_dump()}
        decider = client_for(authorization, principal)  # the policy is checked against it
        settle_call = decider.resolve if approve else decider.reject
        try:
            result = settle_call(promise_id, decision, idempotency_key=key)
        except (AlreadySettledError, PromiseTimedOutError) as exc:
            # Settled before this click (or timed out): say how, when and by whom.
            approval = approval_view(client.get(promise_id))
            when = approval.settled_at.isoformat() if approval.settled_at else "earlier"
            decided = approval.decision if isinstance(approval.decision, dict) else {}
            who = decided.get("reviewer") or approval.settled_by
            by = f" by {who}" if who else ""
            conflict = ConflictView(
                detail=f"approval {promise_id!r} was already {approval.outcome} at {when}{by}",
                reason=exc.reason,
                approval=approval,
            )
            return JSONResponse(conflict.model_dump(mode="json"), status_code=409)
        verb = "approved" if approve else "rejected"
        _log.info("%s %s (applied=%s)", verb, promise_id, result.applied)
        return SettledView(applied=result.applied, approval=approval_view(result.promise))

    conflict_doc: dict[int | str, dict[str, Any]] = {
        404: {"description": "No such approval"},
        409: {"model": ConflictView, "description": "Already settled (or timed out)"},
    }

    @app.post("/approvals/{promise_id}/approve", responses=conflict_doc, response_model=SettledView)
    def approve(
        promise_id: str,
        body: DecisionRequest | None = None,
        idempotency_key: Annotated[str | None, Header()] = None,
        authorization: Annotated[str | None, Header()] = None,
        x_troth_principal: Annotated[str | None, Header()] = None,
    ) -> SettledView | JSONResponse:
        """Approve: the workflow continues with the decision."""
        return settle(promise_id, True, body, idempotency_key, authorization, x_troth_principal)

    @app.post("/approvals/{promise_id}/reject", responses=conflict_doc, response_model=SettledView)
    def reject(
        promise_id: str,
        body: DecisionRequest | None = None,
        idempotency_key: Annotated[str | None, Header()] = None,
        authorization: Annotated[str | None, Header()] = None,
        x_troth_principal: Annotated[str | None, Header()] = None,
    ) -> SettledView | JSONResponse:
        """Reject: the workflow sees the rejection and reports it."""
        return settle(promise_id, False, body, idempotency_key, authorization, x_troth_principal)

    return app


app = create_app()
"""The app uvicorn serves: `uvicorn gateway:app`."""
