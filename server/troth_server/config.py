"""Server settings: one frozen object, read from flags and `TROTH_*` environment variables."""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from troth._durations import EXAMPLES, duration_ms, unit_hint
from troth._grpc_args import (
    MAX_PERMITTED_PING_INTERVAL_MS,
    PERMITTED_PING_INTERVAL_MS,
    PING_INTERVAL_MS,
)
from troth_server.auth import (
    PERMISSIONS_CLAIM,
    SUPPORTED_ALGORITHMS,
    AuthSources,
    parse_algorithms,
    permissions_claim_problem,
)
from troth_server.console import INSTALL_COMMAND as CONSOLE_INSTALL
from troth_server.domain.schema import SchemaBounds
from troth_server.units import duration_text, size_text

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


def parse_duration_ms(text: str) -> int:
    """`250ms`, `30s`, `5m`, `24h`, `7d`, sums such as `1h30m` -> milliseconds (a bare
    `0` is 0): the CLI's syntax (`troth._durations`)."""
    ms = duration_ms(text)
    if ms is None:
        how = unit_hint(text) or f"write it like {EXAMPLES} (or 0)"
        raise ValueError(f"{text!r} is not a duration; {how}")
    return ms


def parse_processes(text: str) -> int:
    """`--processes`: a positive number, or `auto` (the CPUs this process may run on)."""
    if text.strip().lower() == "auto":
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of processes; write 2, or auto") from None
    if count < 1:
        raise ValueError(f"{text!r}: at least 1 process")
    return count


DEFAULT_WORKFLOW_TTL_MS = 30 * 86_400_000
"""30 days: a workflow started without a ttl outlives a 3-day (or 2-week) approval."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Input limits; requests beyond them get INVALID_ARGUMENT naming the field."""

    max_id_length: int = 256
    max_payload_bytes: int = 1_048_576
    max_tags: int = 32
    max_tag_key_length: int = 128
    max_tag_value_length: int = 1024
    max_headers: int = 64
    max_idempotency_key_length: int = 256
    max_principal_length: int = 256
    max_schema_bytes: int = 65_536
    max_schema_depth: int = 32
    max_value_depth: int = 64
    max_check_depth: int = 128
    max_schema_steps: int = 50_000
    max_unique_items: int = 10_000
    max_title_length: int = 1024
    max_message_bytes: int = 65_536
    default_page_size: int = 100
    max_page_size: int = 1000
    default_ttl_ms: int = 86_400_000
    default_workflow_ttl_ms: int = DEFAULT_WORKFLOW_TTL_MS
    """A workflow's lifetime when its start gives none (`--default-workflow-ttl`):
    long enough for the approvals it waits on, which its lifetime caps."""
    max_ttl_ms: int = 366 * 86_400_000
    default_lease_ms: int = 10_000
    max_lease_ms: int = 600_000
    max_poll_capacity: int = 1000
    max_watch_backlog: int = 1000
    max_callback_ids: int = 10_000

    def schema_bounds(self) -> SchemaBounds:
        """What one schema check may cost (`domain.schema`)."""
        return SchemaBounds(
            max_schema_depth=self.max_schema_depth,
            max_value_depth=self.max_value_depth,
            max_check_depth=self.max_check_depth,
            max_schema_steps=self.max_schema_steps,
            max_unique_items=self.max_unique_items,
        )


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = "127.0.0.1:7070"
    db: str = "sqlite:///troth.db"
    db_listen_url: str | None = None
    """PostgreSQL: the URL of the connection replicas hear each other's commits on
    (LISTEN), which keeps its session; None: --db's."""
    db_transaction_pooling: bool = False
    """PostgreSQL: --db goes through a transaction-mode pooler (PgBouncer)."""
    migrate: bool = False
    processes: int = 1
    """Server processes sharing the listen port and the store (`troth_server.supervisor`);
    more than one: a supervisor starts them and keeps them running."""
    sqlite_synchronous: str = "FULL"
    sweep_interval_ms: int = 1000
    sweep_batch: int = 1000
    commit_max_batch: int = 512
    retention_ms: int = 30 * 86_400_000
    shutdown_grace_ms: int = 5000
    log_level: str = "info"
    log_format: str = "auto"
    port_file: str | None = None
    max_concurrent_rpcs: int = 1000
    """Unary calls handled at once; more are refused RESOURCE_EXHAUSTED (OVERLOADED)."""
    max_streams: int = 1000
    """Open Poll / WatchPromise / WatchPromises streams; more are refused likewise."""
    max_queued_writes: int = 1024
    """Write requests waiting for the group committer; more are refused likewise."""
    max_queue_delay_ms: int = 1000
    """How long calls may have waited, before the server could start them, while
    it still takes new ones (api/_admission.py `QueueDelay`)."""
    auth_tokens: str | None = None
    """The token file (principals with hashed secrets); reloaded on SIGHUP."""
    jwt_key_file: str | None = None
    """A PEM public key (RS256, EdDSA) or an HS256 secret that JWTs are signed with."""
    jwt_jwks_file: str | None = None
    """A JWKS file of keys that JWTs are signed with (chosen by `kid`)."""
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_algorithms: str = ",".join(SUPPORTED_ALGORITHMS)
    jwt_permissions_claim: str = PERMISSIONS_CLAIM
    """The JWT claim that lists a principal's permission names (a list of strings, or
    one space-separated string as OAuth's `scope`)."""
    no_auth: bool = False
    """Authentication off, for local development on a loopback address."""
    allow_public_without_auth: bool = False
    """Authentication off even on a non-loopback address (loud; rarely right)."""
    # TLS (troth_server._tls): all None serves plaintext.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    settle_token_keys: str | None = None
    """The settle-token keys file (`troth_server.settle_keys`); None: no settle tokens."""
    metrics_listen: str | None = None
    """HOST:PORT to serve Prometheus metrics on (`troth_server.metrics`); None: off."""
    console_listen: str | None = None
    """HOST:PORT to serve the web console on from this process (`troth_server.console`,
    a client of this server's gRPC port on loopback); None: off."""
    otlp_endpoint: str | None = None
    """Where to export spans over OTLP/gRPC (`troth_server._tracing`); None: as
    OpenTelemetry's own `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_TRACES_EXPORTER` say."""
    metrics_port_file: str | None = None
    """Where to write the metrics' port once served (no flag: a supervisor's child)."""
    keepalive_min_ping_interval_ms: int = PERMITTED_PING_INTERVAL_MS
    """The shortest interval between a client's pings that earns no strike (gRPC's
    ping-strike window; the third strike ends the connection, `too_many_pings`).
    Derived from the SDK's ping interval (`troth._grpc_args`); 0 permits any."""
    limits: Limits = Limits()

    def auth_sources(self) -> AuthSources | None:
        """Where principals come from; None when authentication is off (`--no-auth`)."""
        if self.no_auth:
            return None
        return AuthSources(
            tokens_file=Path(self.auth_tokens) if self.auth_tokens else None,
            jwt_key_file=Path(self.jwt_key_file) if self.jwt_key_file else None,
            jwt_jwks_file=Path(self.jwt_jwks_file) if self.jwt_jwks_file else None,
            jwt_issuer=self.jwt_issuer or None,
            jwt_audience=self.jwt_audience or None,
            jwt_algorithms=parse_algorithms(self.jwt_algorithms),
            jwt_permissions_claim=self.jwt_permissions_claim,
        )


# flag name -> (Settings/Limits field, parser, help). Every flag is also TROTH_<NAME>.
_OPTIONS: dict[str, tuple[str, Callable[[str], object] | None, str]] = {
    "listen": ("listen", str, "address to serve gRPC on, HOST:PORT (port 0 picks a free one)"),
    "db": ("db", str, "database URL; the embedded default is a SQLite file"),
    "db-listen-url": (
        "db_listen_url",
        str,
        "PostgreSQL: the database URL replicas hear each other's commits on (LISTEN, one "
        "connection kept open); it needs a session of its own: PostgreSQL directly or a "
        "session-mode pool, never a transaction-mode pooler (default: --db)",
    ),
    "db-transaction-pooling": (
        "db_transaction_pooling",
        bool,
        "PostgreSQL: --db goes through a transaction-mode pooler (PgBouncer "
        "pool_mode=transaction): prepare no statements and keep no setting per session; "
        "needs --db-listen-url",
    ),
    "migrate": (
        "migrate",
        bool,
        "upgrade a PostgreSQL schema that is behind before serving (SQLite always is)",
    ),
    "processes": (
        "processes",
        parse_processes,
        "server processes sharing the listen port and the database, to use several cores: "
        "a supervisor starts them, forwards signals and restarts one that dies; a number, "
        "or auto (one per CPU this process may run on)",
    ),
    "sqlite-synchronous": (
        "sqlite_synchronous",
        str,
        "SQLite synchronous: FULL (durable) or NORMAL, EXTRA, OFF",
    ),
    "sweep-interval": ("sweep_interval_ms", None, "how often overdue promises are expired"),
    "sweep-batch": ("sweep_batch", int, "promises expired per transaction"),
    "commit-max-batch": ("commit_max_batch", int, "most write requests in one group commit"),
    "retention": (
        "retention_ms",
        None,
        "settled promises (finished workflows whole) are pruned this long after they "
        "settled; 0 keeps them forever",
    ),
    "shutdown-grace": ("shutdown_grace_ms", None, "time given to in-flight RPCs on SIGTERM"),
    "log-level": ("log_level", str, "debug, info, warning or error"),
    "log-format": ("log_format", str, "auto (JSON off a terminal), json or console"),
    "port-file": ("port_file", str, "write the bound port to this file once serving"),
    "max-concurrent-rpcs": (
        "max_concurrent_rpcs",
        int,
        "unary calls handled at once (those on a worker's Calls stream too); more are "
        "refused RESOURCE_EXHAUSTED with a retry delay",
    ),
    "max-streams": (
        "max_streams",
        int,
        "Poll, Calls and Watch streams open at once; more are refused likewise",
    ),
    "max-queued-writes": (
        "max_queued_writes",
        int,
        "write requests waiting for the store; more are refused likewise",
    ),
    "max-queue-delay": (
        "max_queue_delay_ms",
        None,
        "when every call of the last 100 ms waited longer than this before the server "
        "could start it, new calls are refused likewise until the backlog drains",
    ),
    "auth-tokens": (
        "auth_tokens",
        str,
        "token file of principals with hashed secrets (`troth tokens new` mints entries); "
        "reloaded on SIGHUP",
    ),
    "jwt-key-file": (
        "jwt_key_file",
        str,
        "accept JWTs signed with this key: a PEM public key (RS256, EdDSA) or an HS256 "
        "secret; reloaded on SIGHUP",
    ),
    "jwt-jwks-file": (
        "jwt_jwks_file",
        str,
        "accept JWTs signed with a key of this JWKS file (picked by kid); reloaded on SIGHUP",
    ),
    "jwt-issuer": ("jwt_issuer", str, "the iss every JWT must carry"),
    "jwt-audience": ("jwt_audience", str, "the aud every JWT must carry"),
    "jwt-algorithms": (
        "jwt_algorithms",
        str,
        "JWT algorithms accepted, comma-separated, of HS256, RS256, EdDSA",
    ),
    "jwt-permissions-claim": (
        "jwt_permissions_claim",
        str,
        "the JWT claim that lists the principal's permission names, matched by approver "
        "policies' permissions: a list of strings, or a space-separated string as OAuth's "
        "scope (e.g. scope)",
    ),
    "no-auth": (
        "no_auth",
        bool,
        "authentication off: every caller may do everything (local development, loopback "
        "addresses only)",
    ),
    "allow-public-without-auth": (
        "allow_public_without_auth",
        bool,
        "with --no-auth, serve a non-loopback address anyway: anyone who reaches it may do "
        "everything",
    ),
    # TLS: all three read once at start (troth_server._tls); none given is plaintext.
    "tls-cert": ("tls_cert", str, "serve TLS with this PEM certificate chain (needs --tls-key)"),
    "tls-key": ("tls_key", str, "the PEM private key of --tls-cert"),
    "tls-client-ca": (
        "tls_client_ca",
        str,
        "mTLS: require client certificates signed by these PEM CA certificates",
    ),
    "settle-token-keys": (
        "settle_token_keys",
        str,
        "JSON file of the keys that sign and verify settle tokens (several, one active; "
        "re-read when it changes); unset: MintSettleToken is refused",
    ),
    "metrics-listen": (
        "metrics_listen",
        str,
        "serve Prometheus metrics over HTTP on HOST:PORT (/metrics; docs/operations.md "
        "lists them; with --processes, every process's, labelled process); unset: no metrics",
    ),
    "console-listen": (
        "console_listen",
        str,
        "serve the web console over HTTP on HOST:PORT from this process (it calls this "
        "server's gRPC port on loopback; each person signs in with their own token); needs "
        f"{CONSOLE_INSTALL}; unset: no console",
    ),
    "otlp-endpoint": (
        "otlp_endpoint",
        str,
        "export spans of each RPC and commit over OTLP/gRPC to this URL, e.g. "
        "http://127.0.0.1:4317 (needs pip install './server[otel]'); unset: "
        "OTEL_EXPORTER_OTLP_ENDPOINT "
        "and OTEL_TRACES_EXPORTER (otlp, console, none) decide, and by default nothing is "
        "exported",
    ),
    "keepalive-min-ping-interval": (
        "keepalive_min_ping_interval_ms",
        None,
        "accept a client's keepalive pings this often (troth's SDK pings every "
        f"{duration_text(PING_INTERVAL_MS)} on an open call or stream); pings sooner "
        "are strikes, and the third ends the connection (GOAWAY too_many_pings); at most "
        f"{duration_text(MAX_PERMITTED_PING_INTERVAL_MS)}, 0 accepts any",
    ),
    "max-id-length": ("max_id_length", int, "longest promise id"),
    "max-payload-bytes": ("max_payload_bytes", int, "largest param or value (data plus headers)"),
    "max-tags": ("max_tags", int, "most tags on one promise"),
    "max-tag-key-length": ("max_tag_key_length", int, "longest tag key"),
    "max-tag-value-length": ("max_tag_value_length", int, "longest tag value"),
    "max-headers": ("max_headers", int, "most headers in one param or value"),
    "max-idempotency-key-length": ("max_idempotency_key_length", int, "longest idempotency key"),
    "max-schema-bytes": ("max_schema_bytes", int, "largest promise schema (JSON text, bytes)"),
    "max-schema-depth": ("max_schema_depth", int, "deepest nesting of a promise schema (JSON)"),
    "max-value-depth": (
        "max_value_depth",
        int,
        "deepest nesting of a resolve value checked against a schema (JSON)",
    ),
    "max-check-depth": (
        "max_check_depth",
        int,
        "schema rules applied inside one another in one check, $refs followed",
    ),
    "max-schema-steps": (
        "max_schema_steps",
        int,
        "schema rules applied in one check of a resolve value (its cost budget)",
    ),
    "max-unique-items": ("max_unique_items", int, "items of one array uniqueItems may compare"),
    "default-page-size": ("default_page_size", int, "search page size when the request gives none"),
    "max-page-size": ("max_page_size", int, "largest search page"),
    "default-ttl": (
        "default_ttl_ms",
        None,
        "expiry of a promise created without one (a workflow's steps: capped by the workflow)",
    ),
    "default-workflow-ttl": (
        "default_workflow_ttl_ms",
        None,
        "lifetime of a workflow started without a ttl (a root or child start: a create "
        "tagged troth:invoke), at most --max-ttl; its steps never outlive it",
    ),
    "max-ttl": ("max_ttl_ms", None, "longest ttl (and furthest expire_time) accepted"),
    "default-lease": ("default_lease_ms", None, "lease of a delivered task when Poll gives none"),
    "max-lease": ("max_lease_ms", None, "longest task lease a worker may ask for"),
    "max-poll-capacity": ("max_poll_capacity", int, "most tasks one Poll stream may hold"),
    "max-watch-backlog": (
        "max_watch_backlog",
        int,
        "events a WatchPromises stream may fall behind before it is ended",
    ),
    "max-callback-ids": (
        "max_callback_ids",
        int,
        "most promise ids one CompleteTask.suspend_on or RegisterCallbacks may name",
    ),
}
_LIMIT_FIELDS = {f.name for f in fields(Limits)}

# Removed flags (and their TROTH_* variables): still parsed, hidden from --help, so
# that an old command line fails saying why instead of "unrecognized arguments".
# flag -> (the one value still accepted, as a no-op, or None; why it went).
_REMOVED: dict[str, tuple[str | None, str]] = {
    "grpc-mode": (
        "aio",
        "thread mode was removed; the server always runs grpc.aio "
        "(bench/README.md has the figures). Drop the setting",
    ),
    "grpc-workers": (
        None,
        "it sized the thread-mode handler pool, and thread mode was removed. Drop the setting",
    ),
}


def settings_from(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> Settings:
    """Flags win over `TROTH_*` variables, which win over defaults."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    _refuse_removed(args, environ, parser)
    values: dict[str, object] = {}
    for flag, (name, kind, _help) in _OPTIONS.items():
        raw = getattr(args, flag.replace("-", "_"))
        env_name = "TROTH_" + flag.upper().replace("-", "_")
        if raw is None:
            raw = environ.get(env_name)
            source = env_name
        else:
            source = "--" + flag
        if raw is None:
            continue
        try:
            if kind is bool:
                values[name] = raw if isinstance(raw, bool) else _parse_bool(raw)
            else:
                values[name] = parse_duration_ms(raw) if kind is None else kind(raw)
        except ValueError as exc:
            parser.error(f"{source}: {exc}")
    limit_values = {k: v for k, v in values.items() if k in _LIMIT_FIELDS}
    other = {k: v for k, v in values.items() if k not in _LIMIT_FIELDS}
    settings = Settings(**other, limits=Limits(**limit_values))  # type: ignore[arg-type]
    _check(settings, parser)
    limits = settings.limits
    if limits.default_workflow_ttl_ms > limits.max_ttl_ms:
        if "default_workflow_ttl_ms" in values:
            parser.error("default-workflow-ttl cannot exceed max-ttl")
        # The 30-day default gives way to a shorter --max-ttl.
        limits = replace(limits, default_workflow_ttl_ms=limits.max_ttl_ms)
        settings = replace(settings, limits=limits)
    return settings


def _refuse_removed(
    args: argparse.Namespace, environ: Mapping[str, str], parser: argparse.ArgumentParser
) -> None:
    for flag, (no_op, why) in _REMOVED.items():
        raw = getattr(args, flag.replace("-", "_"))
        source = "--" + flag
        if raw is None:
            source = "TROTH_" + flag.upper().replace("-", "_")
            raw = environ.get(source)
        if raw is None or (no_op is not None and raw.strip().lower() == no_op):
            continue
        parser.error(f"{source} {raw}: {why}")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a yes/no value; write true or false")


def _check(settings: Settings, parser: argparse.ArgumentParser) -> None:
    positive = [
        "sweep_interval_ms",
        "sweep_batch",
        "commit_max_batch",
        "max_concurrent_rpcs",
        "max_streams",
        "max_queued_writes",
        "max_queue_delay_ms",
    ]
    for name in positive:
        if getattr(settings, name) <= 0:
            parser.error(f"{name.replace('_', '-')} must be positive")
    for f in fields(Limits):
        if getattr(settings.limits, f.name) <= 0:
            parser.error(f"{f.name.replace('_', '-')} must be positive")
    if settings.limits.default_page_size > settings.limits.max_page_size:
        parser.error("default-page-size cannot exceed max-page-size")
    if settings.limits.default_ttl_ms > settings.limits.max_ttl_ms:
        parser.error("default-ttl cannot exceed max-ttl")
    if settings.limits.default_lease_ms > settings.limits.max_lease_ms:
        parser.error("default-lease cannot exceed max-lease")
    _check_keepalive(settings, parser)
    if settings.processes > 1 and settings.listen.startswith(("unix:", "unix-abstract:")):
        parser.error(
            f"--processes {settings.processes} with --listen {settings.listen}: several "
            "processes share a TCP port (SO_REUSEPORT), not a unix socket; listen on "
            "HOST:PORT, or run one process"
        )
    if settings.db_transaction_pooling and not settings.db_listen_url:
        parser.error(
            "--db-transaction-pooling: replicas hear each other's commits with LISTEN, "
            "which a transaction-mode pooler loses (it hands the session to other "
            "clients); give --db-listen-url (TROTH_DB_LISTEN_URL) a URL to PostgreSQL "
            "directly or to a session-mode pool"
        )
    for flag, listen in (
        ("--metrics-listen", settings.metrics_listen),
        ("--console-listen", settings.console_listen),
    ):
        if listen is not None:
            try:
                split_listen(listen)
            except ValueError as exc:
                parser.error(f"{flag}: {exc}")
    if settings.console_listen is not None and settings.tls_cert:
        parser.error(
            "--console-listen calls this server over plaintext gRPC on loopback, and this "
            "server serves TLS (--tls-cert): run the console as a process of its own, "
            "troth console --server HOST:PORT --tls-ca FILE"
        )
    _check_auth(settings, parser)


def _check_keepalive(settings: Settings, parser: argparse.ArgumentParser) -> None:
    interval = settings.keepalive_min_ping_interval_ms
    if interval < 0:
        parser.error("keepalive-min-ping-interval must not be negative (0 accepts any)")
    if interval > MAX_PERMITTED_PING_INTERVAL_MS:
        parser.error(
            f"--keepalive-min-ping-interval {duration_text(interval)} is longer than troth's "
            f"SDK waits between pings ({duration_text(PING_INTERVAL_MS)}, give or take a busy "
            "machine's timer): the server would count each ping as a strike and cut idle "
            "workers and watches off (GOAWAY too_many_pings); use at most "
            f"{duration_text(MAX_PERMITTED_PING_INTERVAL_MS)} (default "
            f"{duration_text(PERMITTED_PING_INTERVAL_MS)})"
        )


_SOURCE_FLAGS = {"auth_tokens": "--auth-tokens", "jwt_key_file": "--jwt-key-file",
                 "jwt_jwks_file": "--jwt-jwks-file"}  # fmt: skip

NO_AUTH_CONFIGURED = (
    "authentication is not configured: pass --auth-tokens FILE (a token file; "
    "`troth tokens new` mints entries) and/or --jwt-key-file FILE or --jwt-jwks-file FILE "
    "(to accept JWTs), or --no-auth to run without authentication for local development "
    "on a loopback address (each flag is also a TROTH_* variable, e.g. TROTH_NO_AUTH=1)"
)


def _check_auth(settings: Settings, parser: argparse.ArgumentParser) -> None:
    sources = [flag for name, flag in _SOURCE_FLAGS.items() if getattr(settings, name)]
    if settings.no_auth and sources:
        parser.error(f"--no-auth contradicts {', '.join(sources)}: pick one")
    uses_jwt = settings.jwt_key_file or settings.jwt_jwks_file
    for name in ("jwt_issuer", "jwt_audience"):
        if getattr(settings, name) and not uses_jwt:
            parser.error(f"--{name.replace('_', '-')} needs --jwt-key-file or --jwt-jwks-file")
    try:
        parse_algorithms(settings.jwt_algorithms)
    except ValueError as exc:
        parser.error(f"--jwt-algorithms: {exc}")
    problem = permissions_claim_problem(settings.jwt_permissions_claim)
    if problem is not None:
        parser.error(f"--jwt-permissions-claim: {problem}")


def split_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` or `[v6]:PORT` -> (host, port); ValueError naming the problem."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT; write it like 127.0.0.1:9464")
    return host.strip("[]"), int(port)


def is_loopback(listen: str) -> bool:
    """Whether `listen` (HOST:PORT, [v6]:PORT or unix:PATH) is reachable only from this machine."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return True
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_refusal(settings: Settings) -> str | None:
    """Why `troth serve` must not start with these settings' authentication, or None."""
    if not settings.no_auth:
        return (
            None if any(getattr(settings, name) for name in _SOURCE_FLAGS) else NO_AUTH_CONFIGURED
        )
    if not is_loopback(settings.listen) and not settings.allow_public_without_auth:
        return (
            f"--no-auth on {settings.listen}, which is not a loopback address: anyone who "
            "can reach it could settle, cancel and forge every workflow. Configure "
            "authentication (--auth-tokens FILE, --jwt-key-file FILE or --jwt-jwks-file "
            "FILE), listen on 127.0.0.1, or, if you really mean it, add "
            "--allow-public-without-auth"
        )
    console = settings.console_listen
    if console is not None and not is_loopback(console) and not settings.allow_public_without_auth:
        return (
            f"--no-auth with --console-listen {console}, which is not a loopback address: "
            "anyone who can reach the console could settle and cancel every workflow "
            "through it. Configure authentication, serve the console on 127.0.0.1, or, if "
            "you really mean it, add --allow-public-without-auth"
        )
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="troth serve",
        description="Serve durable promises over gRPC. Every flag is also a TROTH_* "
        "environment variable (--max-ttl is TROTH_MAX_TTL).",
    )
    defaults = Settings()
    for flag, (name, kind, help_text) in _OPTIONS.items():
        source = defaults.limits if name in _LIMIT_FIELDS else defaults
        default = getattr(source, name)
        if kind is bool:
            parser.add_argument(f"--{flag}", action="store_true", default=None, help=help_text)
            continue
        if kind is None:
            shown = duration_text(default)
        else:
            shown = size_text(default) if name.endswith("_bytes") else default
        parser.add_argument(f"--{flag}", default=None, help=f"{help_text} (default: {shown})")
    for flag in _REMOVED:
        parser.add_argument(f"--{flag}", default=None, help=argparse.SUPPRESS)
    return parser
