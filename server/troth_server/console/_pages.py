"""The HTML of the pages: Jinja2 templates (autoescaped) from `templates/`, and the
context every page shares (who is signed in, the CSRF value, the server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from starlette.responses import HTMLResponse

from troth_server.console import _session
from troth_server.console._forms import RAW_FIELD

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["TEMPLATES", "render"]

TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=jinja2.select_autoescape(("html",), default=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.globals["RAW_FIELD"] = RAW_FIELD


def _choice(text: str) -> str:
    """An enum choice (JSON text) as a person reads it: strings without their quotes."""
    value = json.loads(text)
    return value if isinstance(value, str) else text


TEMPLATES.filters["choice"] = _choice


def render(request: Request, name: str, http_status: int = 200, **context: Any) -> HTMLResponse:
    """Page `name` with `context`, plus who is signed in, the CSRF value, the server."""
    console = request.app.state.console
    who = _session.identity(request)
    page = TEMPLATES.get_template(name).render(
        who=who,
        csrf=_session.csrf_token(request),
        csrf_field=_session.CSRF_FIELD,
        server=console.settings.server,
        path=request.url.path,
        **context,
    )
    response = HTMLResponse(page, status_code=http_status)
    _session.finish(request, response, secure=console.settings.secure_cookies)
    return response
