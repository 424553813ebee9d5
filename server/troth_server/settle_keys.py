"""The server's settle-token keys, read from `--settle-token-keys FILE` and reloaded
when the file changes (a new active key for rotation; an old key removed to retire it).

The file is JSON (`domain.settle_tokens.parse_keys`). It is looked at, by its
modification time and size, at most once a second, on the calling thread; a
file that no longer parses keeps the keys last read (and logs why, never the
keys), so a half-written file cannot stop every settle link at once. The
secrets never reach a log line.

Create a file with two fresh keys, the second active::

    python -m troth_server.settle_keys new k1 k2 > settle-keys.json
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
import threading
import time
from typing import TYPE_CHECKING

import structlog

from troth_server.domain.settle_tokens import Keyring, KeysInvalid, parse_keys

if TYPE_CHECKING:
    from collections.abc import Callable

log = structlog.get_logger("troth.settle_tokens")

_RECHECK_S = 1.0


class SettleKeys:
    """The keyring of a keys file, as it is now (within a second)."""

    def __init__(self, path: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._checked = 0.0
        self._keyring = self._read()  # the first read must succeed: raises otherwise

    def _stat(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def _read(self) -> Keyring:
        try:
            seen = self._stat()
            with open(self.path, encoding="utf-8") as file:
                keyring = parse_keys(file.read())
        except OSError as exc:
            raise KeysInvalid(f"{self.path}: cannot be read ({exc.strerror})") from None
        except KeysInvalid as exc:
            raise KeysInvalid(f"{self.path}: {exc}") from None
        self._seen, self._checked = seen, self._monotonic()
        return keyring

    def keyring(self) -> Keyring:
        """The keys, re-read if the file changed since it was last looked at."""
        with self._lock:
            if self._monotonic() - self._checked < _RECHECK_S:
                return self._keyring
            self._checked = self._monotonic()
            try:
                changed = self._stat() != self._seen
            except OSError:
                changed = False  # gone for a moment (an editor's rename): keep the keys
            if changed:
                try:
                    self._keyring = self._read()
                    log.info(
                        "settle_tokens.keys_reloaded",
                        path=self.path,
                        active=self._keyring.active,
                        key_ids=sorted(self._keyring.keys),
                    )
                except KeysInvalid as exc:
                    log.warning("settle_tokens.keys_not_reloaded", path=self.path, why=str(exc))
            return self._keyring


def new_keys_file(key_ids: list[str]) -> str:
    """JSON text of a keys file with a fresh 32-byte key per id, the last one active."""
    keys = {k: base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
            for k in key_ids}  # fmt: skip
    text = json.dumps({"active": key_ids[-1], "keys": keys}, indent=2)
    parse_keys(text)  # the ids must be valid
    return text + "\n"


if __name__ == "__main__":  # pragma: no cover - exercised by a test as a subprocess
    if len(sys.argv) < 3 or sys.argv[1] != "new":
        print("usage: python -m troth_server.settle_keys new KEY_ID [KEY_ID ...]", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(new_keys_file(sys.argv[2:]))
