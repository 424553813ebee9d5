"""The web console, a client of the troth API: served by `troth console` (a process of
its own) or by `troth serve --console-listen` (beside the gRPC server, in its process).

The approvals inbox (forms from each promise's JSON Schema), a promise's page,
the workflows list, a workflow's timeline and its actions, the tasks and workers
lists, live through Server-Sent Events from `WatchPromises`. Pure parts: `_forms`
and `_views`; the app: `_app` (composition and `main`), `_routes`, `_pages`
(templates), `_session` (cookies, CSRF), `_clients` (one SDK `Client` per person),
`_live` (SSE), `_hosted` (served from a thread of `troth serve`'s process).
Its web dependencies come with the `console` extra: this module imports none of
them, and says in one line how to install them when they are missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from troth_server.console._hosted import HostedConsole as HostedConsole

__all__ = ["INSTALL_COMMAND", "ConsoleUnavailable", "missing_dependency", "require", "start_hosted"]

INSTALL_COMMAND = "pip install './server[console]'"
"""How the console's dependencies are installed (from a checkout, as the README says)."""

_DEPENDENCIES = frozenset({"starlette", "jinja2", "uvicorn", "markupsafe", "anyio"})


class ConsoleUnavailable(Exception):
    """The console cannot be served here (its dependencies are missing): the one line why."""


def missing_dependency(error: ModuleNotFoundError) -> str | None:
    """The line saying which of the console's dependencies is missing and how to install
    them; None when `error` is about another module (a bug, not an installation)."""
    top = (error.name or "").split(".")[0]
    if top not in _DEPENDENCIES:
        return None
    return (
        f"the web console needs {top}, which is not installed; install the console's "
        f"dependencies: {INSTALL_COMMAND} (in a troth checkout; `make install` has them)"
    )


def require() -> None:
    """Import the console's dependencies now (before a server opens anything).

    Raises:
        ConsoleUnavailable: One is missing (the message names the install command).
    """
    try:
        import troth_server.console._hosted  # noqa: F401
    except ModuleNotFoundError as exc:
        words = missing_dependency(exc)
        if words is None:
            raise
        raise ConsoleUnavailable(words) from exc


def start_hosted(listen: str, server: str) -> HostedConsole:
    """Serve the console on `listen` (HOST:PORT) from a thread of this process, as a
    client of the troth server at `server` (this process's own gRPC port).

    Raises:
        ConsoleUnavailable: A dependency is missing.
        OSError: `listen` cannot be bound.
    """
    require()
    from troth_server.console._hosted import start

    return start(listen, server)
