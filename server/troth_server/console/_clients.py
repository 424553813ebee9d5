"""One SDK `Client` per signed-in person, cached: each person's calls carry their token.

A console process never sends a token of its own: each person brings theirs
(the sign-in page), and nobody signed in calls with none, so the server's
roles and approver policies decide what each may see and settle.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troth import Client
from troth.errors import ConfigurationError

if TYPE_CHECKING:
    from troth_server.console._config import ConsoleSettings

__all__ = ["ANONYMOUS", "ClientCache", "Identity"]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is using the console: a bearer token, or (on a server without
    authentication) only a name, sent as the principal; or nobody."""

    token: str | None = field(default=None, repr=False)
    name: str | None = None

    @property
    def signed_in(self) -> bool:
        return bool(self.token or self.name)

    def key(self) -> str:
        """The cache key: a digest, so the token itself is kept in one place."""
        raw = f"{self.token or ''}\0{self.name or ''}".encode()
        return hashlib.sha256(raw).hexdigest()


ANONYMOUS = Identity()

_TOKEN_VARIABLES = ("TROTH_TOKEN", "TROTH_TOKEN_FILE")
"""Where the SDK's `Client(token=None)` finds a token of its own (`troth._credentials`)."""


class ClientCache:
    """Clients by identity, the `size` most recently used kept (the others closed)."""

    def __init__(self, settings: ConsoleSettings, size: int = 64) -> None:
        for variable in _TOKEN_VARIABLES:
            if os.environ.get(variable):
                # Client(token=None) would send its token on everyone's behalf.
                raise ConfigurationError(
                    f"{variable} is set: the console would send its token for everyone "
                    "not signed in; unset it for this process (each person signs in "
                    "with their own token)"
                )
        self._settings = settings
        self._size = size
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, Client] = OrderedDict()

    def client(self, identity: Identity) -> Client:
        """The identity's client, made on first use.

        Raises:
            ConfigurationError: The token is not one printable word, or may not be
                sent in plaintext to this server's address.
        """
        key = identity.key()
        with self._lock:
            found = self._clients.get(key)
            if found is not None:
                self._clients.move_to_end(key)
                return found
        settings = self._settings
        made = Client(
            settings.server,
            timeout=settings.timeout,
            principal=identity.name or None,
            tls=settings.tls if settings.tls is not None else False,
            token=identity.token or None,
        )
        evicted: list[Client] = []
        with self._lock:
            found = self._clients.get(key)
            if found is not None:  # another request made it meanwhile
                evicted.append(made)
                made = found
            else:
                self._clients[key] = made
                while len(self._clients) > self._size:
                    evicted.append(self._clients.popitem(last=False)[1])
        for old in evicted:
            old.close()
        return made

    def forget(self, identity: Identity) -> None:
        """Close the identity's client (its person signed out)."""
        with self._lock:
            found = self._clients.pop(identity.key(), None)
        if found is not None:
            found.close()

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for one in clients:
            one.close()
