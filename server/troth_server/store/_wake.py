"""What a commit announces to the other server processes on one database, in words
both carriers share: PostgreSQL's NOTIFY (`_listen.Announcer`) and, for several
processes on one SQLite file, datagrams on this machine (`_processes.LocalAnnouncer`).

An announcement names the groups that got PENDING tasks and the promises that were
created or settled; the receiver turns it into dispatcher and watcher wake-ups and
`WatchPromises` events (a `StoreEvent`). Announcements are a fast path only: the
periodic scans find what a lost one would have said.
"""

from __future__ import annotations

import base64
import uuid
import zlib
from typing import TYPE_CHECKING

import orjson
import structlog

from troth_server.store import StoreEvent

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

log = structlog.get_logger("troth.store.listen")


class Announcements:
    """The payloads of one process's announcements: encoded (compressed when its ids
    outgrow a plain payload), split to fit `max_payload` bytes, and decoded."""

    notify_sql: str | None = None
    """The statement each of `notifications` is the parameters of, written in the
    transaction (PostgreSQL: delivered only if it commits); None: `send` them after
    the commit instead."""

    def __init__(self, channel: str, max_payload: int) -> None:
        self.channel = channel
        self._max_payload = max_payload
        self._origin = uuid.uuid4().hex[:12]
        """Marks this process's own announcements, which it ignores."""

    def notifications(
        self,
        groups: Collection[str],
        settled: Collection[str],
        created: Collection[str] = (),
    ) -> list[dict[str, str]]:
        """The announcements of these changes, one payload each: one, unless even
        compressed they outgrow a payload (then as few as carry them)."""
        entries = (
            [("g", g) for g in sorted(groups)]
            + [("c", i) for i in created]
            + [("s", i) for i in settled]
        )
        return [{"channel": self.channel, "payload": p} for p in self._payloads(entries)]

    def send(self, notifications: list[dict[str, str]]) -> None:
        """Send `notifications` now, after their transaction committed (where
        `notify_sql` is None)."""
        raise NotImplementedError

    def listen(self, on_event: Callable[[StoreEvent], None]) -> None:
        """Call `on_event`, from a thread of its own, for each announcement received."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _payloads(self, entries: list[tuple[str, str]]) -> list[str]:
        """`entries` in one payload under the limit, or halved until each half fits
        (in order: a promise's CREATED is never after its SETTLED)."""
        payload = self._encode(entries)
        if len(payload.encode()) <= self._max_payload or len(entries) <= 1:
            return [payload]
        half = len(entries) // 2
        return self._payloads(entries[:half]) + self._payloads(entries[half:])

    def _encode(self, entries: list[tuple[str, str]]) -> str:
        body: dict[str, list[str]] = {"g": [], "s": []}
        for key, value in entries:
            body.setdefault(key, []).append(value)
        # "c" only when there are some: a replica from before created ids ignores the key.
        plain = orjson.dumps({"o": self._origin, **body}).decode()
        if len(plain.encode()) <= self._max_payload:
            return plain
        # Ids repeat their prefixes (roots, steps, groups): compressed, a batch's
        # hundreds fit one payload. The origin stays plain, to skip one's own unread.
        packed = base64.b85encode(zlib.compress(orjson.dumps(body), 6)).decode()
        return orjson.dumps({"o": self._origin, "z": packed}).decode()

    def _decode(self, payload: str) -> StoreEvent | None:
        try:
            message = orjson.loads(payload)
        except orjson.JSONDecodeError:
            log.warning("listen.bad_payload", payload=payload[:200])
            return None
        if message.get("o") == self._origin:
            return None
        if message.get("r"):
            return StoreEvent(resync=True)
        if "z" in message:
            try:
                message = orjson.loads(zlib.decompress(base64.b85decode(message["z"])))
            except (ValueError, zlib.error, orjson.JSONDecodeError):
                log.warning("listen.bad_payload", payload=payload[:200])
                return None
        return StoreEvent(
            frozenset(message.get("g", ())),
            tuple(message.get("s", ())),
            created_ids=tuple(message.get("c", ())),
        )

    def resync_payload(self) -> str:
        """An announcement that some may have been lost: the receiver rechecks everything."""
        return orjson.dumps({"o": self._origin, "r": 1}).decode()


def deliver(on_event: Callable[[StoreEvent], None], event: StoreEvent) -> None:
    # A wake-up that fails (the database went away while a watcher's promise was
    # read) is caught up by the next tick's rescan; the listener carries on.
    try:
        on_event(event)
    except Exception as exc:
        log.warning("listen.handler_failed", error=str(exc))
