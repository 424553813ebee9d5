"""Cross-replica announcements over PostgreSQL LISTEN/NOTIFY.

A write transaction announces (with `pg_notify`, delivered only if it commits)
the groups that got PENDING tasks and the promises that settled or were
created. Every replica listens on one dedicated connection and turns
announcements from the others into dispatcher and watcher wake-ups and
`WatchPromises` events. Notifications are a fast path only: a replica that was
disconnected resyncs (the periodic scans find any task or settle a lost
notification would have announced; event streams, which cannot replay what
they missed, are ended so that their clients re-list).

A commit announces in one NOTIFY (compressed when its ids outgrow a plain payload):
PostgreSQL serialises notifying commits, cluster-wide, on one lock held through each
one's commit, so what counts is that a group commit is one notifying transaction
(bench/notify_commits.py measures it). The listener's connection is its own
(`--db-listen-url`): LISTEN needs a session, which a transaction-mode pooler does
not keep; one that goes through a pooler is warned about at start.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import psycopg
import structlog
from psycopg import sql

from troth_server.store import StoreEvent
from troth_server.store._wake import Announcements, deliver

if TYPE_CHECKING:
    from collections.abc import Callable

log = structlog.get_logger("troth.store.listen")

# PostgreSQL's limit: a payload shorter than 8000 bytes.
_MAX_PAYLOAD = 7900
_RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)


class Announcer(Announcements):
    """One store's side of the channel: what it sends, and its listener thread."""

    notify_sql = "SELECT pg_notify(%(channel)s, %(payload)s)"
    """The statement each of `notifications` is the parameters of."""

    def __init__(self, conninfo: str, channel: str, database: str | None = None) -> None:
        super().__init__(channel, _MAX_PAYLOAD)
        self._conninfo = conninfo
        self._database = database
        """The database the writes go to (None: unchecked): the listener's must be it."""
        self._warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def listen(self, on_event: Callable[[StoreEvent], None]) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(on_event,), name="troth-listen", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(5)

    def _run(self, on_event: Callable[[StoreEvent], None]) -> None:
        failures = 0
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    self._conn = conn
                    if not self._warned:
                        self._warned = True
                        self._check_session(conn)
                    # The session's last statement (pg_stat_activity shows it).
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    if not first:
                        log.info("listen.reconnected", channel=self.channel)
                        deliver(on_event, StoreEvent(resync=True))
                    first = False
                    failures = 0
                    while not self._stop.is_set():
                        for notify in conn.notifies(timeout=1.0):
                            event = self._decode(notify.payload)
                            if event is not None:
                                deliver(on_event, event)
            except psycopg.Error as exc:
                if self._stop.is_set():
                    return
                first = False
                delay = _RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)]
                failures += 1
                log.warning("listen.disconnected", error=str(exc).strip(), retry_in=delay)
                self._stop.wait(delay)
            except Exception:
                log.exception("listen.failed")
                self._stop.wait(1.0)
            finally:
                self._conn = None

    def _check_session(self, conn: psycopg.Connection[Any]) -> None:
        """Warn when this connection cannot hear the writes' announcements: it is
        to another database, or it goes through a pooler (which, pooling per
        transaction, gives the LISTEN's session to other clients)."""
        row = conn.execute("SELECT current_database(), pg_backend_pid()").fetchone()
        assert row is not None
        database, server_pid = row
        where = conn.info.host, conn.info.port, conn.info.dbname
        if self._database is not None and database != self._database:
            log.error(
                "listen.other_database",
                listening_to=database,
                writing_to=self._database,
                fix="give --db-listen-url the database --db writes to; replicas "
                "hear each other's commits only there",
            )
        if conn.info.backend_pid != server_pid:
            # PostgreSQL tells a client its backend's pid at connect; a pooler
            # (PgBouncer) tells it one of its own instead.
            log.warning(
                "listen.through_pooler",
                host=where[0],
                port=where[1],
                database=where[2],
                why="the listener's connection goes through a connection pooler: "
                "in transaction mode (PgBouncer pool_mode=transaction) its LISTEN "
                "is lost and replicas stop hearing each other's commits",
                fix="point --db-listen-url (TROTH_DB_LISTEN_URL) at PostgreSQL "
                "directly or at a session-mode pool",
            )
