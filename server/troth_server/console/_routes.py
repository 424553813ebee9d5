"""The console's pages and form posts: each reads or settles through the signed-in
person's `Client` (blocking SDK calls run on Starlette's thread pool) and renders
a template; the server's refusals are shown in words (`_views.error_words`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from itertools import islice
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote

import grpc
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response, StreamingResponse

from troth import PromiseState, TaskInfo
from troth._tasks import TaskCalls
from troth.client import connection
from troth.errors import (
    ConfigurationError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RpcError,
    TrothError,
    UnauthenticatedError,
)
from troth_server.console import _session, _views
from troth_server.console._clients import Identity
from troth_server.console._filters import PAGE_SIZE, STATES, WorkflowFilters, filters_from
from troth_server.console._forms import FormError, form_for, value_from
from troth_server.console._live import event_lines
from troth_server.console._pages import render

if TYPE_CHECKING:
    from starlette.requests import Request

    from troth import Client, Promise, WorkflowInfo, WorkflowState
    from troth_server.console._app import Console

__all__ = ["ROUTES"]

Endpoint = Callable[["Request"], Awaitable[Response]]

INBOX_LIMIT = 200
STEPS_LIMIT = 1000
TASKS_LIMIT = 200
MAX_FORM_BYTES = 64 * 1024

_HTTP_STATUS = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 502,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _client(request: Request) -> Client:
    return _console(request).clients.client(_session.identity(request))


def _refusal(error: TrothError) -> tuple[str, int]:
    if isinstance(error, RpcError):
        return _views.error_words(error), _HTTP_STATUS.get(error.code, 502)
    if isinstance(error, ConfigurationError):
        return f"The console cannot use these credentials: {error}", 400
    return str(error), 500


def _page(handler: Endpoint) -> Endpoint:
    """A page whose reads the server may refuse: the refusal becomes an error page."""

    @wraps(handler)
    async def page(request: Request) -> Response:
        try:
            return await handler(request)
        except TrothError as exc:
            words, status = _refusal(exc)
            return render(request, "error.html", status, message=words, status=status)

    return page


async def _form(request: Request) -> dict[str, str] | Response:
    """The posted fields, or the refusal of a post that is too big or forged."""
    length = int(request.headers.get("content-length") or 0)
    if length > MAX_FORM_BYTES:
        return render(request, "error.html", 413, message="The form is too big.", status=413)
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return render(request, "error.html", 413, message="The form is too big.", status=413)
    form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if not _session.csrf_ok(request, form):
        message = (
            "This form was not sent by a console page open in this browser (its CSRF "
            "value does not match): reload the page and send it again."
        )
        return render(request, "error.html", 403, message=message, status=403)
    return form


def _now() -> datetime:
    return datetime.now(UTC)


# --- the inbox and one promise -----------------------------------------------


def _inbox(client: Client, mine: bool) -> list[Promise]:
    found = client.search_all(
        states=[PromiseState.PENDING],
        tags={_views.TAG_KIND: _views.APPROVAL},
        page_size=INBOX_LIMIT,
        mine=mine,
    )
    return list(islice(found, INBOX_LIMIT))


@_page
async def inbox(request: Request) -> Response:
    client = _client(request)
    signed_in = _session.identity(request).signed_in
    mine = signed_in and request.query_params.get("all") != "1"
    promises = await run_in_threadpool(_inbox, client, mine)
    rows = _views.inbox_rows(promises, _now())
    forms = {p.id: form_for(p.schema) for p in promises}
    keys = {p.id: uuid.uuid4().hex for p in promises}
    return render(
        request, "inbox.html", rows=rows, forms=forms, keys=keys, mine=mine, limit=INBOX_LIMIT
    )


def _decoded(client: Client, promise: Promise, which: str) -> str:
    payload = promise.param if which == "param" else promise.value
    if payload.is_empty:
        return ""
    try:
        return _views.pretty(client.decode(payload))
    except Exception:  # any codec's failure: say so rather than fail the page
        return f"({len(payload.data)} bytes the console cannot decode)"


def _promise_page(
    request: Request, client: Client, promise: Promise, status: int = 200, error: str = ""
) -> Response:
    now = _now()
    return render(
        request,
        "promise.html",
        status,
        p=promise,
        row=next(iter(_views.inbox_rows([promise], now)), None),
        form=form_for(promise.schema),
        key=uuid.uuid4().hex,
        param=_decoded(client, promise, "param"),
        value=_decoded(client, promise, "value"),
        schema=_views.pretty(promise.schema) if promise.schema else "",
        error=error,
        decidable=_decidable(promise),
        root=promise.root_id if promise.root_id and promise.root_id != promise.id else "",
    )


def _decidable(promise: Promise) -> bool:
    """A pending wait for a decision (`ctx.promise()`, or a standalone promise), not a
    workflow's root or a step a worker settles (`run`, `sleep`, `start`)."""
    tags = promise.tags
    return (
        promise.state is PromiseState.PENDING
        and _views.TAG_INVOKE not in tags
        and tags.get(_views.TAG_KIND, _views.APPROVAL) == _views.APPROVAL
    )


@_page
async def promise(request: Request) -> Response:
    client = _client(request)
    found = await run_in_threadpool(client.get, request.path_params["id"])
    return _promise_page(request, client, found)


@_page
async def settle(request: Request) -> Response:
    id = request.path_params["id"]
    form = await _form(request)
    if isinstance(form, Response):
        return form
    client = _client(request)
    found = await run_in_threadpool(client.get, id)
    action = form.get("action", "")
    key = form.get("key") or None
    try:
        if action == "approve":
            value = value_from(form_for(found.schema), form)
            result = await run_in_threadpool(client.resolve, id, value, idempotency_key=key)
        elif action == "reject":
            reason = form.get("reason", "").strip()
            rejection = {"reason": reason} if reason else None
            result = await run_in_threadpool(client.reject, id, rejection, idempotency_key=key)
        else:
            raise FormError("action", "must be approve or reject")
    except FormError as exc:
        return _promise_page(request, client, found, 400, f"{exc.field} {exc.message}")
    except RpcError as exc:
        words, status = _refusal(exc)
        fresh = await run_in_threadpool(client.get, id)
        return _promise_page(request, client, fresh, status, words)
    root = found.root_id if found.root_id and found.root_id != id else ""
    target = f"/workflows/{quote(root)}" if root else f"/promises/{quote(id)}"
    response = RedirectResponse(f"{target}?settled={quote(id)}", status_code=303)
    if result.workflow_waiting:
        # The decision counts, but its workflow waits for a worker of its version: the
        # page the person lands on says so (the server's words, kept for one view).
        _session.note(
            response, result.workflow_waiting, secure=_console(request).settings.secure_cookies
        )
    return response


# --- a workflow's timeline -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Operations:
    """What the workflow page knows of a run's task, and whether the person may act."""

    task: TaskInfo | None
    """Its task when one is not completed (paused, waiting for a worker, held by one),
    as SearchWorkflows gives it to anyone who may read the workflow."""
    may_operate: bool
    """The server let them read the run's tasks: their roles are an operator's (or the
    server runs without authentication), so they are offered Retry now, Fail, Cancel
    and Move. The server still decides each (`act`): a refusal is shown in its words."""


def _operations(client: Client, root: Promise) -> _Operations:
    """A pending workflow's task, and whether the person may operate on it."""
    group = root.tags.get(_views.TAG_INVOKE)
    if group is None or root.state is not PromiseState.PENDING:
        return _Operations(None, may_operate=False)
    found = client.search_workflows(id=root.id, limit=10)
    task = next((w.task for w in found if w.id == root.id), None)
    try:
        TaskCalls(connection(client)).search(group, 1, root.id)
    except (PermissionDeniedError, UnauthenticatedError):
        return _Operations(task, may_operate=False)
    return _Operations(task, may_operate=True)


def _workflow(client: Client, id: str) -> tuple[Promise, list[Promise]]:
    root = client.get(id)
    # The root first, then its steps: a workflow that ends meanwhile then shows a
    # pending root with all its steps, never an ended root missing its last ones.
    # Steps by their parent link: a step with an id of its own (`ctx.promise(id=...)`)
    # is there too, and stays after the run ends.
    return root, client.workflow_steps(id)


def _states(client: Client, root_id: str, steps: list[Promise]) -> list[WorkflowState]:
    """The workflow's state slots its steps read or wrote, as they are now (those the
    signed-in person may read)."""
    found: list[WorkflowState] = []
    for name in _views.state_names(steps):
        try:
            found.append(client.get_state(root_id, name))
        except (PermissionDeniedError, NotFoundError):
            break
    return found


def _workflow_list(client: Client, filters: WorkflowFilters) -> list[WorkflowInfo]:
    """Page `filters.page` of the list, and the first of the next (to know there is one)."""
    start = filters.page * PAGE_SIZE
    size = min(start + PAGE_SIZE + 1, 1000)
    found = client.iter_workflows(**filters.arguments(), page_size=size)
    return list(islice(found, start, start + PAGE_SIZE + 1))


@_page
async def workflows(request: Request) -> Response:
    """The Workflows page: filters (state, group, name, version, paused, waiting for a
    human, started after/before), newest first, a page at a time."""
    filters = filters_from(request.query_params)
    found: list[WorkflowInfo] = []
    status, error = 200, "; ".join(filters.errors)
    if not filters.errors:
        try:
            found = await run_in_threadpool(_workflow_list, _client(request), filters)
        except InvalidArgumentError as exc:
            status, error = 400, _views.error_words(exc)
        except ValueError as exc:  # the SDK's own check of the filters
            status, error = 400, str(exc)
    rows = _views.workflow_rows(found[:PAGE_SIZE], _now())
    return render(
        request,
        "workflows.html",
        status,
        filters=filters,
        rows=rows,
        error=error,
        states=STATES,
        newer=filters.query(filters.page - 1) if filters.page else None,
        older=filters.query(filters.page + 1) if len(found) > PAGE_SIZE else None,
        first=filters.page * PAGE_SIZE + 1,
    )


@_page
async def workflow(request: Request) -> Response:
    id = request.path_params["id"] or request.query_params.get("id", "").strip()
    if not id:
        return RedirectResponse("/workflows", status_code=303)
    if not request.path_params["id"]:
        return RedirectResponse(f"/workflows/{quote(id)}", status_code=303)
    return await _workflow_page(request, id)


_DONE = {
    "retried": "Retried now: the workflow goes to a worker of its group at once.",
    "failed": "The workflow was failed: its root is rejected with your reason.",
    "cancelled": "The workflow was cancelled, with its pending steps.",
}


async def _workflow_page(request: Request, id: str, status: int = 200, error: str = "") -> Response:
    client = _client(request)
    root, steps = await run_in_threadpool(_workflow, client, id)
    if _views.TAG_INVOKE not in root.tags and root.parent_id:
        # A step's id: the page of the workflow it belongs to. (A child workflow has a
        # page of its own: its steps are its own, by their parent link.)
        return RedirectResponse(f"/workflows/{quote(root.parent_id)}", status_code=303)
    lines = _views.timeline(root, steps[:STEPS_LIMIT], client.decode)
    waiting = [line for line in lines if line.waiting]
    ops = await run_in_threadpool(_operations, client, root)
    states = await run_in_threadpool(_states, client, root.id, steps[:STEPS_LIMIT])
    settled = request.query_params.get("settled", "")
    note = _session.read_note(request) if settled else ""
    response = render(
        request,
        "workflow.html",
        status,
        root=root,
        lines=lines,
        waiting=waiting,
        settled=settled,
        version_wait=_views.version_wait(ops.task if ops.may_operate else None, note),
        paused=_views.pause(ops.task, _now()),
        task=ops.task,
        operable=ops.may_operate and root.state is PromiseState.PENDING,
        done=_DONE.get(request.query_params.get("done", ""), ""),
        error=error,
        truncated=len(steps) > STEPS_LIMIT,
        states=_views.state_rows(states),
    )
    if note:
        _session.clear_note(response)
    return response


@_page
async def move(request: Request) -> Response:
    """An operator's button: run a workflow waiting for a version on the newest code."""
    id = request.path_params["id"]
    form = await _form(request)
    if isinstance(form, Response):
        return form
    client = _client(request)
    await run_in_threadpool(TaskCalls(connection(client)).move_workflow, id, None)
    return RedirectResponse(f"/workflows/{quote(id)}?moved=1", status_code=303)


# --- an operator's actions on a workflow ------------------------------------------------


def _retry(client: Client, id: str, reason: str) -> None:
    client.retry_workflow_now(id)


def _fail(client: Client, id: str, reason: str) -> None:
    TaskCalls(connection(client)).fail_workflow(id, reason)


def _cancel(client: Client, id: str, reason: str) -> None:
    client.cancel(id, {"reason": reason})


_ACTIONS: dict[str, tuple[Callable[[Client, str, str], None], bool, str]] = {
    "retry": (_retry, False, "retried"),
    "fail": (_fail, True, "failed"),
    "cancel": (_cancel, True, "cancelled"),
}
"""action -> (the call, whether it needs a reason, the word for the page after)."""


@_page
async def act(request: Request) -> Response:
    """Retry now, Fail or Cancel a workflow, as the signed-in person: the server decides
    (roles, the run's state); a refusal is shown on the workflow's page in its words."""
    id = request.path_params["id"]
    form = await _form(request)
    if isinstance(form, Response):
        return form
    call, needs_reason, done = _ACTIONS[request.url.path.split("/", 2)[1]]
    reason = form.get("reason", "").strip()
    if needs_reason and not reason:
        return await _workflow_page(
            request, id, 400, "Give a reason: it is recorded with the workflow."
        )
    try:
        await run_in_threadpool(call, _client(request), id, reason)
    except RpcError as exc:
        words, status = _refusal(exc)
        return await _workflow_page(request, id, status, words)
    return RedirectResponse(f"/workflows/{quote(id)}?done={done}", status_code=303)


# --- tasks and workers ---------------------------------------------------------------


@_page
async def tasks(request: Request) -> Response:
    group = request.query_params.get("group", "").strip()
    rows: list[_views.TaskRow] = []
    if group:
        client = _client(request)
        found = await run_in_threadpool(client.search_tasks, group, limit=TASKS_LIMIT)
        rows = _views.task_rows(found, _now())
    return render(request, "tasks.html", group=group, rows=rows, limit=TASKS_LIMIT)


@_page
async def workers(request: Request) -> Response:
    client = _client(request)
    try:
        found = await run_in_threadpool(client.list_workers)
    except RpcError as exc:
        if exc.code is not grpc.StatusCode.UNIMPLEMENTED:
            raise
        # A server older than SearchWorkers: say so rather than fail.
        return render(request, "workers.html", available=False, rows=[])
    rows = _views.worker_rows(found, _now())
    return render(request, "workers.html", available=True, rows=rows)


# --- live updates ----------------------------------------------------------------------


async def events(request: Request) -> Response:
    console = _console(request)
    id = request.query_params.get("id", "*") or "*"
    kind = request.query_params.get("kind", "")
    tags = {_views.TAG_KIND: kind} if kind else {}
    try:
        client = _client(request)
    except ConfigurationError as exc:
        return Response(f"{exc}\n", status_code=400, media_type="text/plain")
    return StreamingResponse(
        event_lines(client, id, tags, console.bridges),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


# --- signing in and out ------------------------------------------------------------------


async def sign_in_page(request: Request) -> Response:
    return render(request, "signin.html", error="")


def _check(client: Client) -> None:
    client.search(page_size=1)


async def sign_in(request: Request) -> Response:
    form = await _form(request)
    if isinstance(form, Response):
        return form
    token = form.get("token", "").strip()
    name = form.get("name", "").strip()
    if token.lower().startswith("bearer "):
        token = token[len("bearer ") :].strip()
    who = Identity(token or None, name or None)
    if not who.signed_in:
        return render(request, "signin.html", 400, error="Paste your token (or, on a server "
                      "without authentication, type your name).")  # fmt: skip
    console = _console(request)
    try:
        client = console.clients.client(who)
        await run_in_threadpool(_check, client)
    except TrothError as exc:
        console.clients.forget(who)
        words, status = _refusal(exc)
        return render(request, "signin.html", status, error=words)
    response = RedirectResponse("/", status_code=303)
    _session.remember(response, who, secure=console.settings.secure_cookies)
    return response


@_page
async def me(request: Request) -> Response:
    """Who you are signed in as, as the server knows your credential: name, roles, task
    groups, id prefixes and the permission names approver policies may list."""
    if not _session.identity(request).signed_in:
        return RedirectResponse("/signin", status_code=303)
    caller = await run_in_threadpool(_client(request).whoami)
    return render(request, "me.html", caller=caller)


async def sign_out(request: Request) -> Response:
    form = await _form(request)
    if isinstance(form, Response):
        return form
    _console(request).clients.forget(_session.identity(request))
    response = RedirectResponse("/", status_code=303)
    _session.sign_out(response)
    return response


async def health(request: Request) -> Response:
    """Up, and how many live pages hold a watch of the server now."""
    live = _console(request).bridges.open
    return Response(f"ok\nlive pages: {live}\n", media_type="text/plain")


ROUTES: list[tuple[str, Endpoint, list[str]]] = [
    ("/", inbox, ["GET"]),
    ("/me", me, ["GET"]),
    ("/promises/{id:path}", promise, ["GET"]),
    ("/settle/{id:path}", settle, ["POST"]),
    ("/workflows", workflows, ["GET"]),
    ("/workflows/{id:path}", workflow, ["GET"]),
    ("/move/{id:path}", move, ["POST"]),
    ("/retry/{id:path}", act, ["POST"]),
    ("/fail/{id:path}", act, ["POST"]),
    ("/cancel/{id:path}", act, ["POST"]),
    ("/tasks", tasks, ["GET"]),
    ("/workers", workers, ["GET"]),
    ("/events", events, ["GET"]),
    ("/signin", sign_in_page, ["GET"]),
    ("/signin", sign_in, ["POST"]),
    ("/signout", sign_out, ["POST"]),
    ("/healthz", health, ["GET"]),
]
