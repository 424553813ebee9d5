"""PostgreSQL for tests, decided once per run; one fresh schema per user.

Where the suite's PostgreSQL comes from, in this order (`decide`, run once by the
pytest process that starts the run; xdist workers inherit the decision):

1. `TROTH_TEST_PG` when set: that admin URL, as given.
2. The machine's default server, `postgresql://postgres@127.0.0.1:5432/test`
   (`TROTH_TEST_PG_DEFAULT` overrides the URL probed), if it answers.
3. A throwaway cluster the run starts itself (`initdb`/`pg_ctl`, found on PATH,
   through pg_config, under /usr/lib/postgresql/*/bin, or in `TROTH_PG_BIN`),
   on a free port in a directory under /tmp. The first process that needs it
   starts it (under a file lock in the run's state directory), every xdist
   worker shares it, and the process that started it stops it at its session
   end, once no other process uses it (each user holds a shared flock). A
   watchdog stops it if that process dies first.
4. None: every PostgreSQL test is skipped, and the run ends with one line saying
   how to run them. Under `CI=true` they are required: each fails instead,
   saying why.

Every test (or server fixture) gets its own schema in the `test` database,
named after its process, so concurrent or earlier runs never see each other's
rows; the schema is dropped afterwards.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal, NoReturn
from urllib.parse import quote

import psycopg
import pytest
from _pg_cluster import PG_BIN_ENV, Cluster, ClusterUnavailable, owner_prefix, pg_bindir
from _procs import Cleanup

URL_ENV = "TROTH_TEST_PG"
DEFAULT_ENV = "TROTH_TEST_PG_DEFAULT"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
DECISION_ENV = "TROTH_TEST_PG_DECISION"
"""Where the deciding process leaves its decision (JSON) for the xdist workers."""

HOW_TO_RUN = (
    "install the PostgreSQL server binaries (initdb and pg_ctl, e.g. `apt install postgresql`; "
    f"or point {PG_BIN_ENV} at them) and the suite starts its own, "
    f"or set {URL_ENV}=postgresql://USER@HOST:PORT/DATABASE"
)
SKIPPED = "no PostgreSQL for the tests"
"""The start of every skip reason of this module (counted for the run's summary)."""
REQUIRED = "CI=true requires the PostgreSQL tests"
"""The start of every failure for want of PostgreSQL under CI."""

Source = Literal["env", "default", "cluster", "none"]


@dataclass(frozen=True)
class Decision:
    source: Source
    url: str = ""
    """The admin URL (env, default); empty for a cluster until it is started."""
    state_dir: str = ""
    """cluster: the run's directory for the lock, the state file and the users' flocks."""
    why: str = ""
    """none: what was looked for and not found."""

    def describe(self) -> str:
        if self.source == "env":
            return f"{URL_ENV}={self.url}"
        if self.source == "default":
            return f"the machine's server, {self.url}"
        if self.source == "cluster":
            return f"a throwaway cluster the run starts on first use (initdb from {self.why})"
        return f"none ({self.why}): PostgreSQL tests are skipped"


def required() -> bool:
    """Whether PostgreSQL tests must run (CI): then they fail instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=5):
            return True
    except psycopg.Error:
        return False


def decide() -> Decision:
    """Where this run's PostgreSQL comes from (see the module docstring)."""
    given = os.environ.get(URL_ENV)
    if given:
        return Decision("env", url=given)
    default = os.environ.get(DEFAULT_ENV) or DEFAULT_URL
    if _answers(default):
        return Decision("default", url=default)
    bindir = pg_bindir()
    nothing = f"no {URL_ENV}, nothing answers at {default}"
    if bindir is None:
        where = os.environ.get(PG_BIN_ENV) or "PATH, pg_config, /usr/lib/postgresql/*/bin"
        return Decision("none", why=f"{nothing}, and no initdb/pg_ctl in {where}")
    try:
        owner_prefix()
    except ClusterUnavailable as exc:
        return Decision("none", why=f"{nothing}, and {exc}")
    state_dir = tempfile.mkdtemp(prefix="troth-test-pg-run-")
    return Decision("cluster", state_dir=state_dir, why=str(bindir))


_decision: Decision | None = None


def decision() -> Decision:
    """This run's decision: the one inherited from the deciding process, else made now."""
    global _decision
    if _decision is None:
        inherited = os.environ.get(DECISION_ENV)
        if inherited:
            _decision = Decision(**json.loads(inherited))
        else:
            _decision = decide()
            os.environ[DECISION_ENV] = json.dumps(asdict(_decision))
    return _decision


# --- the run's shared cluster ----------------------------------------------------------


class _Shared:
    """This process's part in the run's shared cluster: a user (a shared flock on
    `users`), and maybe the one that started it (its cluster and watchdog)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.url: str | None = None
        self._users: IO[bytes] | None = None
        self._started: tuple[Cluster, Cleanup] | None = None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.state_dir / "lock").open("ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _use(self) -> bool:
        """Take a shared flock on `users`; False if its starter is stopping it now."""
        users = (self.state_dir / "users").open("ab")
        try:
            fcntl.flock(users, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            users.close()
            return False
        self._users = users
        return True

    def admin_url(self) -> str:
        while self.url is None:
            with self._locked():
                state = self.state_dir / "state.json"
                if state.exists() and not _alive(json.loads(state.read_text())["pid"]):
                    state.unlink()  # its starter died (its watchdog stopped it): a new one
                if state.exists():
                    if self._use():
                        self.url = json.loads(state.read_text())["url"]
                else:
                    self.url = self._start(state)
            if self.url is None:  # the starter is stopping it: then start another
                time.sleep(0.05)
        return self.url

    def _start(self, state: Path) -> str:
        try:
            cluster = Cluster.create()
        except ClusterUnavailable as exc:  # e.g. the binaries went away since the decision
            _unavailable(str(exc))
        watchdog = Cleanup(cluster.stop_command(), remove=cluster.root)
        try:
            cluster.start_on_a_free_port()
            url = cluster.create_database("test")
        except BaseException:
            watchdog.close()
            raise
        self._started = (cluster, watchdog)
        if not self._use():  # pragma: no cover - only a starter takes it exclusively
            raise RuntimeError("the run's PostgreSQL users file is locked exclusively")
        state.write_text(json.dumps({"url": url, "pid": os.getpid(), "root": str(cluster.root)}))
        return url

    def release(self) -> None:
        """At session end: stop using it; the starter waits until nobody does, then
        stops it."""
        users, self._users = self._users, None
        if self._started is None:
            if users is not None:
                users.close()
            return
        cluster, watchdog = self._started
        assert users is not None
        fcntl.flock(users, fcntl.LOCK_EX)  # every other user has ended its session
        try:
            with self._locked():
                (self.state_dir / "state.json").unlink(missing_ok=True)
                watchdog.close()  # pg_ctl stop, and the directory removed
        finally:
            users.close()
            self._started = None
            shutil.rmtree(cluster.root, ignore_errors=True)


_shared: _Shared | None = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unavailable(why: str) -> NoReturn:
    if required():
        pytest.fail(f"{REQUIRED}, and there is no PostgreSQL ({why}); {HOW_TO_RUN}", pytrace=False)
    pytest.skip(f"{SKIPPED} ({why}); the run's summary says how to run them")


def admin_url() -> str:
    """The admin URL of this run's PostgreSQL (started now if it is the run's own);
    skips the calling test when there is none (fails it under CI=true)."""
    global _shared
    made = decision()
    if made.source in ("env", "default"):
        return made.url
    if made.source == "none":
        _unavailable(made.why)
    if _shared is None:
        _shared = _Shared(Path(made.state_dir))
    return _shared.admin_url()


def skip_without_binaries(why: str) -> NoReturn:
    """For tests that need a cluster of their own (initdb, pg_ctl): skip saying `why`,
    as one of the run's PostgreSQL skips when there is no PostgreSQL at all."""
    if decision().source == "none":
        _unavailable(decision().why)
    pytest.skip(why)


def __getattr__(name: str) -> str:
    """`ADMIN_URL`, the name this module's users had: `admin_url()`, resolved on use."""
    if name == "ADMIN_URL":
        return admin_url()
    raise AttributeError(name)


# --- schemas ----------------------------------------------------------------------------

_counter = itertools.count()


def admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(admin_url(), autocommit=True)


def schema_url(schema: str) -> str:
    """The server's `--db` for `schema`: search_path set through libpq options."""
    base = admin_url().replace("postgresql://", "postgresql+psycopg://", 1)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def fresh_schema(*, migrate: bool = True) -> Iterator[str]:
    """A new empty schema; yields its `--db` URL (migrated to head with `migrate`)."""
    schema = f"t{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    with admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = schema_url(schema)
    try:
        if migrate:
            from troth_server.store import open_store

            open_store(url, migrate=True).close()
        yield url
    finally:
        with admin() as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# --- the pytest side: hooks, imported by tests/conftest.py ------------------------------


class _Summary:
    """Counts this run's PostgreSQL skips and failures for one loud closing line."""

    def __init__(self) -> None:
        self.skipped = 0
        self.failed = 0

    def count(self, report: pytest.TestReport) -> None:
        text = str(report.longrepr) if report.longrepr is not None else ""
        if report.skipped and SKIPPED in text:
            self.skipped += 1
        elif report.failed and REQUIRED in text:
            self.failed += 1

    def line(self) -> tuple[str, dict[str, bool]] | None:
        why = decision().why
        if self.failed:
            text = f"{self.failed} PostgreSQL tests FAILED: {REQUIRED} and there is none ({why})"
            return f"{text}; {HOW_TO_RUN}", {"red": True, "bold": True}
        if self.skipped:
            text = f"{self.skipped} PostgreSQL tests SKIPPED ({why}); to run them, {HOW_TO_RUN}"
            return text, {"yellow": True, "bold": True}
        return None


_summary = _Summary()
_state_cleanup: Cleanup | None = None
"""The deciding process's watchdog over the run's state directory (cluster only)."""


def pytest_configure(config: pytest.Config) -> None:
    """Decide once, in the process that starts the run (a decision inherited from an
    enclosing run is not this run's); xdist workers inherit it."""
    global _decision, _state_cleanup
    if not hasattr(config, "workerinput"):
        _decision = decide()
        os.environ[DECISION_ENV] = json.dumps(asdict(_decision))
        if _decision.source == "cluster":  # removed at the end, or if this run is killed
            _state_cleanup = Cleanup(["true"], remove=Path(_decision.state_dir))


def pytest_report_header(config: pytest.Config) -> str:
    return f"postgresql: {decision().describe()}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[None] | Iterator[pytest.TestReport]:
    """A skip of ours is located here, not at the test (as pytest does for a skip in a
    fixture), so that `-ra` folds them all into one line."""
    report: pytest.TestReport = yield  # type: ignore[misc]
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and SKIPPED in str(longrepr[2]):
        report.longrepr = (__file__, _unavailable.__code__.co_firstlineno, longrepr[2])
    return report  # type: ignore[misc]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _summary.count(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    said = _summary.line()
    if said is not None:
        text, markup = said
        terminalreporter.write_sep("!", text, **markup)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Release (or stop) the shared cluster; the deciding process then removes the
    run's state directory."""
    global _shared
    if _shared is not None:
        shared, _shared = _shared, None
        shared.release()
    global _state_cleanup
    if _state_cleanup is not None and not hasattr(config, "workerinput"):
        cleanup, _state_cleanup = _state_cleanup, None
        cleanup.close()  # the run's state directory removed
