"""The console's Schedules page: the schedules (`Client.schedules.list`), and Pause and
Resume buttons, each a call as the signed-in person. The server's roles decide: an
operator or admin lists and pauses them; anyone else is refused in words (the page
itself, or the button's post)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from troth.errors import RpcError
from troth_server.console._pages import render
from troth_server.console._routes import Endpoint, _client, _form, _page, _refusal

if TYPE_CHECKING:
    from datetime import datetime

    from starlette.requests import Request

    from troth import Client, ScheduleInfo

__all__ = ["SCHEDULE_ROUTES", "ScheduleRow", "schedule_rows"]


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One line of the Schedules page."""

    name: str
    cron: str
    timezone: str
    workflow: str
    group: str
    catch_up: str
    paused: bool
    next_tick: str
    last_run: str
    skipped: int


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment is not None else ""


def schedule_rows(found: list[ScheduleInfo]) -> list[ScheduleRow]:
    """The page's rows, by name (pure)."""
    return [
        ScheduleRow(
            name=s.name,
            cron=s.cron,
            timezone=s.timezone,
            workflow=s.workflow,
            group=s.group,
            catch_up=s.catch_up,
            paused=s.paused,
            next_tick=_when(s.next_tick_time),
            last_run=s.last_run_id or "",
            skipped=s.skipped,
        )
        for s in found
    ]


async def _listing(request: Request, status: int = 200, error: str = "") -> Response:
    found = await run_in_threadpool(_client(request).schedules.list)
    done = request.query_params.get("done", "")
    name = request.query_params.get("name", "")
    notice = f"Schedule {name} {done}." if done in ("paused", "resumed") and name else ""
    rows = schedule_rows(found)
    return render(request, "schedules.html", status, rows=rows, done=notice, error=error)


@_page
async def schedules(request: Request) -> Response:
    return await _listing(request)


def _pause(client: Client, name: str) -> None:
    client.schedules.pause(name)


def _resume(client: Client, name: str) -> None:
    client.schedules.resume(name)


@_page
async def pause_or_resume(request: Request) -> Response:
    """Pause or Resume a schedule as the signed-in person; a refusal is shown on the page."""
    name = request.path_params["name"]
    form = await _form(request)
    if isinstance(form, Response):
        return form
    pausing = request.url.path.startswith("/pause-schedule/")
    try:
        await run_in_threadpool(_pause if pausing else _resume, _client(request), name)
    except RpcError as exc:
        words, status = _refusal(exc)
        try:
            return await _listing(request, status, words)
        except RpcError:  # may not even list them: the refusal alone
            return render(request, "error.html", status, message=words, status=status)
    done = "paused" if pausing else "resumed"
    return RedirectResponse(f"/schedules?done={done}&name={quote(name)}", status_code=303)


SCHEDULE_ROUTES: list[tuple[str, Endpoint, list[str]]] = [
    ("/schedules", schedules, ["GET"]),
    ("/pause-schedule/{name:path}", pause_or_resume, ["POST"]),
    ("/resume-schedule/{name:path}", pause_or_resume, ["POST"]),
]
