"""The console served by `troth serve --console-listen`: uvicorn on a thread of its own
(with its own event loop, off the gRPC server's), calling this process's gRPC port on
loopback through the same per-person clients as `troth console` (`_clients`): nobody
signed in calls with no token, so the server's roles decide what each person sees."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import uvicorn

from troth_server.console._app import bind, build_app
from troth_server.console._config import ConsoleSettings

__all__ = ["HostedConsole", "start"]

STOP_SECONDS = 10.0
"""How long `stop` waits for the console's thread (its live pages are cut after 3 s)."""


@dataclass
class HostedConsole:
    """A console serving from a thread: its URL, and `stop`."""

    url: str
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        """Stop serving: open live pages are cut, the clients closed (blocks; call it off
        the gRPC server's event loop, whose calls the console's requests may await)."""
        self._server.should_exit = True
        self._thread.join(STOP_SECONDS)


def start(listen: str, server: str) -> HostedConsole:
    """Bind `listen` (OSError when it cannot be), then serve on a daemon thread.

    Raises:
        ConfigurationError: TROTH_TOKEN is set (the console never sends a token of its own).
    """
    settings = ConsoleSettings(server=server, listen=listen)
    app = build_app(settings)
    sock = bind(settings)
    port = sock.getsockname()[1]
    host = settings.host if ":" not in settings.host else f"[{settings.host}]"
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    # Not on the main thread, uvicorn installs no signal handlers: `troth serve`'s stay.
    served = uvicorn.Server(config)
    thread = threading.Thread(
        target=served.run, kwargs={"sockets": [sock]}, name="troth-console", daemon=True
    )
    thread.start()
    return HostedConsole(f"http://{host}:{port}/", served, thread)
