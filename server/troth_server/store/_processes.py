"""Several server processes on one SQLite file (`troth serve --processes N`): their
write lock and their wake-ups, both local to this machine.

- `WriteLock`: one write transaction at a time across the processes, an exclusive
  `flock` on `<db>.write-lock` held around each (`SqlStore.write`). It waits in the
  kernel (the GIL released), not in SQLite's busy handler, which sleeps and retries;
  and since the transaction begins (`BEGIN IMMEDIATE`) once the lock is held, it
  reads the latest committed state: a claim stays exclusive (DESIGN §4 rules 1, 3, 9)
  as it is with one process.
- `LocalAnnouncer`: after a write transaction commits, what it announces (the groups
  that got PENDING tasks, the promises created and settled: `_wake.Announcements`)
  goes to every other process as a datagram on a unix socket. Each process binds one
  in Linux's abstract namespace (nothing to clean up after a SIGKILL) and leaves a
  file named after it (its pid and a random part) in `<db>.wake/`, which is how the
  others find it; one whose address nobody answers any more has its file removed. A datagram
  that does not fit the receiver's queue is dropped (the writer never waits), and the
  next one to that receiver is preceded by a resync: it rechecks everything, as a
  PostgreSQL replica does when its LISTEN reconnects. A process killed between its
  commit and its send loses those wake-ups; the others' periodic scan (once per
  `--sweep-interval`) finds the work.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from troth_server.store import StoreError
from troth_server.store._wake import Announcements, deliver

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from troth_server.store import StoreEvent

log = structlog.get_logger("troth.store.listen")

_MAX_PAYLOAD = 60_000
"""Bytes of one datagram's payload (a unix datagram socket sends up to its send
buffer, 208 KiB by default)."""
_RELIST_S = 1.0
"""The longest a process goes without listing the others again."""
_RECEIVE_BUFFER = 4 * 1024 * 1024
"""Asked for each process's socket (Linux caps it at net.core.rmem_max)."""


def sidecar(database: str, suffix: str) -> Path:
    """A file beside the SQLite database (`troth.db` -> `troth.db.<suffix>`)."""
    path = Path(database).expanduser().resolve()
    return path.with_name(path.name + "." + suffix)


class WriteLock:
    """The write lock the processes on one SQLite file share (an exclusive `flock`)."""

    def __init__(self, database: str) -> None:
        self.path = sidecar(database, "write-lock")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # blocks in the kernel, the GIL released
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class ServingLock:
    """Who serves a SQLite file: one supervisor of several processes (an exclusive
    `flock` on `<db>.serving`, for as long as it or one of its children runs), or
    servers of one process each (a shared one each): never both, which would not
    share the write lock, the wake-ups or the clock; nor a new supervisor beside the
    children of one killed, still stopping, which read the clock it would replace."""

    def __init__(self, database: str, *, supervisor: bool) -> None:
        path = sidecar(database, "serving")
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if supervisor else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise StoreError(
                f"{database} is served by another troth serve "
                + (
                    "(several processes on one SQLite file need it alone): stop it first"
                    if supervisor
                    else "--processes supervisor, whose processes share one write lock and "
                    "one clock: connect to it, or stop it first"
                )
            ) from None

    def fileno(self) -> int:
        """The locked file: a supervisor's children inherit it, and so hold the lock
        with it (one `flock` per open file) until the last of them has ended."""
        return self._fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class LocalAnnouncer(Announcements):
    """This process's side of the wake-ups between processes on one SQLite file."""

    def __init__(self, database: str) -> None:
        resolved = str(Path(database).expanduser().resolve())
        key = hashlib.sha256(resolved.encode()).hexdigest()[:20]
        super().__init__(key, _MAX_PAYLOAD)
        self._key = key
        self.directory = sidecar(database, "wake")
        self.directory.mkdir(exist_ok=True)
        self._name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        """This process's store's name among the others: its marker file, its address."""
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
        self._socket.bind(self._address(self._name))
        self._socket.settimeout(1.0)
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._marker = self.directory / self._name
        self._marker.touch()
        self._peers: list[str] = []
        self._listed: int | None = None
        self._listed_at = 0.0
        self._dropped: set[str] = set()
        """Peers a datagram to which was dropped: the next one is preceded by a resync."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _address(self, name: str) -> bytes:
        return f"\0troth-wake-{self._key}-{name}".encode()

    def peers(self) -> list[str]:
        """The names of the other processes on this database (re-listed when the
        directory changed, and at least every `_RELIST_S`: a directory's time is as
        coarse as the kernel's clock tick, so two changes in one tick look like one)."""
        try:
            changed = os.stat(self.directory).st_mtime_ns
        except OSError:
            return []
        now = time.monotonic()
        if changed != self._listed or now - self._listed_at > _RELIST_S:
            self._listed = changed
            self._listed_at = now
            self._peers = sorted(
                name
                for name in os.listdir(self.directory)
                if name != self._name and not name.startswith(".")
            )
        return self._peers

    def send(self, notifications: list[dict[str, str]]) -> None:
        payloads = [n["payload"].encode() for n in notifications]
        for peer in self.peers():
            if peer in self._dropped:
                payloads_now = [self.resync_payload().encode(), *payloads]
            else:
                payloads_now = payloads
            for payload in payloads_now:
                try:
                    self._sender.sendto(payload, socket.MSG_DONTWAIT, self._address(peer))
                except BlockingIOError:
                    self._dropped.add(peer)
                    break
                except OSError as exc:
                    if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                        self._gone(peer)
                    else:
                        log.warning("listen.send_failed", to=peer, error=str(exc))
                        self._dropped.add(peer)
                    break
            else:
                self._dropped.discard(peer)

    def _gone(self, peer: str) -> None:
        """Nobody listens at `peer`'s address: that process ended (killed, its file left)."""
        self._dropped.discard(peer)
        with contextlib.suppress(OSError):
            (self.directory / peer).unlink()

    def listen(self, on_event: Callable[[StoreEvent], None]) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(on_event,), name="troth-listen", daemon=True
        )
        self._thread.start()

    def _run(self, on_event: Callable[[StoreEvent], None]) -> None:
        while not self._stop.is_set():
            try:
                data = self._socket.recv(_MAX_PAYLOAD + 1024)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                log.exception("listen.failed")
                self._stop.wait(1.0)
                continue
            event = self._decode(data.decode(errors="replace"))
            if event is not None:
                deliver(on_event, event)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._marker.unlink()
        if self._thread is not None:
            self._thread.join(5)
        self._socket.close()
        self._sender.close()
