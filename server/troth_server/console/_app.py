"""The console's composition root: the Starlette app (routes, static files, the
security headers) and `main`, which serves it with uvicorn until SIGTERM or SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from troth.errors import ConfigurationError
from troth_server import _logging
from troth_server.console._clients import ClientCache
from troth_server.console._config import ConsoleSettings, settings_from
from troth_server.console._live import Bridges
from troth_server.console._routes import ROUTES
from troth_server.console._schedules import SCHEDULE_ROUTES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["Console", "bind", "build_app", "main"]

log = structlog.get_logger("troth_server.console")

_HEADERS = {
    # Scripts, styles and fetches from the console itself only; never framed.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass
class Console:
    """What the routes share: the settings, the clients by person, the live streams."""

    settings: ConsoleSettings
    clients: ClientCache = field(init=False)
    bridges: Bridges = field(default_factory=Bridges)

    def __post_init__(self) -> None:
        self.clients = ClientCache(self.settings)


class _SecurityHeaders(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        if not request.url.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response


def build_app(settings: ConsoleSettings) -> Starlette:
    """The console as an ASGI app (what `main` serves; tests drive it directly too).

    Raises:
        ConfigurationError: TROTH_TOKEN is set (the console never sends a token of its own).
    """
    console = Console(settings)
    routes: list[Route | Mount] = [
        Route(path, endpoint, methods=methods)
        for path, endpoint, methods in (*ROUTES, *SCHEDULE_ROUTES)
    ]
    static = StaticFiles(directory=Path(__file__).parent / "static")
    routes.append(Mount("/static", app=static, name="static"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        console.clients.close()

    app = Starlette(routes=routes, middleware=[Middleware(_SecurityHeaders)], lifespan=lifespan)
    app.state.console = console
    return app


def bind(settings: ConsoleSettings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def main(argv: list[str]) -> int:
    """`troth console`: serve until SIGTERM or SIGINT."""
    settings = settings_from(argv)
    _logging.configure("info", "auto")
    try:
        app = build_app(settings)
        sock = bind(settings)
    except ConfigurationError as exc:
        print(f"troth console: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"troth console: error: cannot listen on {settings.listen}: {exc}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    host = settings.host if ":" not in settings.host else f"[{settings.host}]"
    log.info("console.serving", url=f"http://{host}:{port}/", server=settings.server)
    if settings.port_file:
        tmp = Path(settings.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, settings.port_file)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        # Live pages hold their event streams open: cut them after this long.
        timeout_graceful_shutdown=3,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down, to die of
    # it: ignored here, so that a clean stop exits 0 (as `troth serve` does).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    uvicorn.Server(config).run(sockets=[sock])
    log.info("console.stopped")
    _logging.flush()
    return 0
