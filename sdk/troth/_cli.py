"""The `troth` command: operate on promises from a shell, and start the server.

```
troth [--server ADDR] [--json] [--principal P] [--timeout DURATION] promises get ID
      [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME]
      [--token-file FILE]
troth promises search [ID_GLOB] [--state S ...] [--tag k=v ...] [--limit N]
troth promises create ID [--param JSON] [--tag k=v ...] [--ttl 30s|5m|2h|3d] [--never-expires]
                         [--idempotency-key K] [--strict]
troth promises resolve|reject|cancel ID [--value JSON] [--idempotency-key K] [--strict]
troth promises watch ID [--max-wait DURATION]
troth export|replay ...  (recorded workflow histories; see _cli_replay)
troth tasks list --group G [--limit N]   (see _cli_tasks)
troth workflows show ID | fail ID --reason TEXT   (see _cli_workflows)
troth workers list [--group G]   (connected workers; see _cli_workers)
troth worker MODULE[:ATTR] [--group G] [--path DIR] [--log-level L]   (run one; see _cli_worker)
troth --version
troth approvals list|approve|reject|watch ...   (the inbox; see _cli_approvals)
troth serve ...          (forwarded to troth_server.cli.serve; needs troth-server)
troth db upgrade|current [--db URL]   (forwarded to troth_server.cli.db; needs troth-server)
troth tokens new --name N --roles R [--groups G] [--prefixes P]   (troth_server.cli.tokens)
troth console [--listen HOST:PORT] [--server ADDR] ...   (troth_server.cli.console)
```

Exit codes: 0 success, 1 the server refused or could not be reached (the
message is on stderr, no traceback), 2 bad command line, 130 interrupted.
With `--json`, stdout has one JSON object per line: a promise, or for create
and settles `{"created"|"applied": bool, "promise": {...}}`. Payloads appear
decoded when they are JSON, else as `{"$base64": ..., "headers": {...}}`.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from troth._cli_streams import INTERRUPTED, Interrupts, follow
from troth._convert import timedelta_to_proto
from troth._credentials import TlsConfig
from troth._durations import EXAMPLES, duration_ms, format_duration, unit_hint
from troth._promise import CreateResult, Promise, PromiseState, SettleResult
from troth.client import DEFAULT_ADDRESS, Client, connection
from troth.errors import ConfigurationError, TrothError
from troth.v1 import promises_pb2

if TYPE_CHECKING:
    from troth.codec import Payload

INSTALL_SERVER = (
    "pip install ./server from a troth checkout (./server[postgres] for PostgreSQL; "
    "the SDK, troth, is already installed)"
)
_SERVER_MISSING = "troth {command} needs the server, troth-server, which is not installed: "

_DEFAULT_LIMIT = 100
_DEFAULT_TIMEOUT = timedelta(seconds=10)
_PREVIEW_WIDTH = 40


Handler = Callable[[Client, argparse.Namespace, IO[str]], int]


# --- argument types ---------------------------------------------------------
# argparse turns an ArgumentTypeError into "argument --flag: <message>" and
# exit status 2, so each message names the flag for free and says what to type.


def parse_duration(text: str) -> timedelta:
    """Parse `30s`, `5m`, `2h`, `3d`, `250ms`, or a sum such as `1h30m` (`troth._durations`)."""
    ms = duration_ms(text)
    if hint := unit_hint(text):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: {hint}")
    if ms is None or (ms == 0 and text.strip() == "0"):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit (ms, s, m, h, d), {EXAMPLES}"
        )
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it must be more than 0")
    return timedelta(milliseconds=ms)


def parse_json(text: str) -> Any:
    """Parse a JSON value given on the command line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid JSON {text!r} ({exc.msg} at character {exc.pos}); quote it for the "
            """shell and write strings in JSON quotes, e.g. '{"ok": true}' or '"text"'"""
        ) from None


def parse_tag(text: str) -> tuple[str, str]:
    """Parse a `key=value` tag."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"invalid tag {text!r}: write key=value, e.g. --tag team=billing"
        )
    return key, value


def parse_state(text: str) -> PromiseState:
    """Parse a promise state name, case-insensitively."""
    try:
        return PromiseState(text.strip().upper())
    except ValueError:
        names = ", ".join(state.value for state in PromiseState)
        raise argparse.ArgumentTypeError(f"invalid state {text!r}: use one of {names}") from None


def _positive_int(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: use 0 or more")
    return number


# --- parser -----------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # The same flags sit on the top parser (with real defaults) and on every
    # leaf command (SUPPRESSed, so they only override when given), so both
    # `troth --json promises get X` and `troth promises get X --json` work.
    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--server",
        metavar="ADDR",
        default=default(os.environ.get("TROTH_SERVER", DEFAULT_ADDRESS)),
        help="server host:port, or replicas' as host:port,host:port "
        "(env TROTH_SERVER; default %(default)s)"
        if not suppress
        else argparse.SUPPRESS,
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine output: one JSON object per line" if not suppress else argparse.SUPPRESS,
    )
    parser.add_argument(
        "--principal",
        metavar="NAME",
        default=default(os.environ.get("TROTH_PRINCIPAL")),
        help="who is calling, recorded as settled_by (env TROTH_PRINCIPAL)"
        if not suppress
        else argparse.SUPPRESS,
    )
    parser.add_argument(
        "--timeout",
        metavar="DURATION",
        type=parse_duration,
        default=default(_DEFAULT_TIMEOUT),
        help=f"how long each call may take, retries included ({EXAMPLES}; "
        f"default {format_duration(_DEFAULT_TIMEOUT)})"
        if not suppress
        else argparse.SUPPRESS,
    )
    # Transport security and credentials (troth._credentials): defaults from the
    # same TROTH_* variables Client reads, so flags override them one by one.
    for flag, env, help_text in (
        ("--tls-ca", "TROTH_TLS_CA", "connect over TLS, trusting the CA certificates in FILE"),
        ("--tls-cert", "TROTH_TLS_CERT", "mTLS: present this client certificate (PEM)"),
        ("--tls-key", "TROTH_TLS_KEY", "the private key of --tls-cert (PEM)"),
        (
            "--tls-server-name",
            "TROTH_TLS_SERVER_NAME",
            "check the server's certificate against NAME (needed with several replicas)",
        ),
        (
            "--token-file",
            "TROTH_TOKEN_FILE",
            "send the bearer token in FILE, read again when it changes (else env TROTH_TOKEN)",
        ),
    ):
        parser.add_argument(
            flag,
            metavar="NAME" if flag == "--tls-server-name" else "FILE",
            default=default(os.environ.get(env) or None),
            help=f"{help_text} (env {env})" if not suppress else argparse.SUPPRESS,
        )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=default(False),
        help="connect over TLS, trusting the system's root certificates (env TROTH_TLS=true)"
        if not suppress
        else argparse.SUPPRESS,
    )


def version_text() -> str:
    """`troth --version`: the SDK's version, and troth-server's when it is installed."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    server = version("troth-server")
    return f"troth {version('troth') or 'unknown'}\n" + (
        f"troth-server {server}"
        if server
        else "troth-server not installed (pip install troth-server)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole command line of `troth`."""
    parser = argparse.ArgumentParser(
        prog="troth",
        description="Operate a troth durable-promise server.",
        epilog="Run `troth promises -h` for the promise commands.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # --version's two lines
    )
    parser.add_argument("--version", action="version", version=version_text())
    _global_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    promises = commands.add_parser("promises", help="list, inspect, create and settle promises")
    actions = promises.add_subparsers(dest="action", metavar="ACTION", required=True)

    def leaf(name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        return add_leaf(actions, name, help, handler)

    get = leaf("get", "show one promise", _cmd_get)
    get.add_argument("id", metavar="ID")

    search = leaf("search", "list promises, newest last, following pages", _cmd_search)
    search.add_argument("id", metavar="ID_GLOB", nargs="?", default="*", help="`*` matches any run")
    add_state_option(
        search,
        "only this state (repeat for several): " + ", ".join(state.value for state in PromiseState),
    )
    add_tag_option(search)
    search.add_argument(
        "--limit",
        type=_positive_int,
        default=_DEFAULT_LIMIT,
        metavar="N",
        help="show at most N promises (default %(default)s; 0 for all)",
    )

    create = leaf(
        "create", "create a pending promise (a repeat returns the existing one)", _cmd_create
    )
    create.add_argument("id", metavar="ID")
    create.add_argument("--param", type=parse_json, metavar="JSON", help="""e.g. '{"post": 7}'""")
    add_tag_option(create)
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument(
        "--ttl", type=parse_duration, metavar="DURATION", help="time out after 30s, 5m, 2h, 3d..."
    )
    expiry.add_argument("--never-expires", action="store_true", help="stay pending until settled")
    create.add_argument("--idempotency-key", metavar="KEY")
    create.add_argument(
        "--strict", action="store_true", help="a repeat succeeds only while the promise is pending"
    )

    for name, verb in (("resolve", "resolve"), ("reject", "reject"), ("cancel", "cancel")):
        settle = leaf(name, f"{verb} a pending promise", _settle_command(name))
        settle.add_argument("id", metavar="ID")
        settle.add_argument(
            "--value", type=parse_json, metavar="JSON", help="""e.g. '{"ok": true}'"""
        )
        settle.add_argument("--idempotency-key", metavar="KEY")
        settle.add_argument(
            "--strict",
            action="store_true",
            help="a repeat succeeds only if it asks for the state the promise was settled in",
        )
        if name != "cancel":
            settle.add_argument(
                "--create-if-missing",
                action="store_true",
                help="settle before the wait exists: an unknown id is created already settled",
            )

    watch = leaf("watch", "show a promise now, then again once it settles", _cmd_watch)
    watch.add_argument("id", metavar="ID")
    watch.add_argument(
        "--max-wait", type=parse_duration, metavar="DURATION", help="give up after this long"
    )

    prune = leaf(
        "prune",
        "delete settled promises older than a duration: finished workflows whole, and "
        "standalone promises (what the server's --retention does by itself)",
        _cmd_prune,
    )
    prune.add_argument(
        "--older-than",
        type=parse_duration,
        required=True,
        metavar="DURATION",
        help="prune what settled longer ago than this, e.g. 30d",
    )
    prune.add_argument("--dry-run", action="store_true", help="count them; delete nothing")

    # Imported here, as those modules import this one.
    from troth._cli_approvals import add_commands as add_approvals_commands
    from troth._cli_replay import add_commands as add_replay_commands
    from troth._cli_tasks import add_commands as add_tasks_commands
    from troth._cli_worker import add_commands as add_worker_commands
    from troth._cli_workers import add_commands as add_workers_commands
    from troth._cli_workflows import add_commands as add_workflows_commands

    add_replay_commands(commands)
    add_approvals_commands(commands)
    add_tasks_commands(commands)
    add_workflows_commands(commands)
    add_workers_commands(commands)
    add_worker_commands(commands)

    # Listed for --help only: main() forwards `troth serve ...` before parsing.
    commands.add_parser(
        "serve", help="start a troth server (needs troth-server; see `troth serve --help`)"
    ).add_argument("serve_args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "db",
        help="migrate the server's database or show its schema revision "
        "(needs troth-server; see `troth db --help`)",
    ).add_argument("db_args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "tokens",
        help="mint bearer tokens for the server's token file "
        "(needs troth-server; see `troth tokens new --help`)",
    ).add_argument("tokens_args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "console",
        help="serve the web console: approvals inbox, workflow timelines, tasks, workers "
        "(needs the console's dependencies: pip install './server[console]'; "
        "or serve it from the server: troth serve --console-listen 127.0.0.1:7080)",
    ).add_argument("console_args", nargs=argparse.REMAINDER)
    return parser


# --- entry point ------------------------------------------------------------


def add_leaf(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    handler: Handler,
) -> argparse.ArgumentParser:
    """A command that runs `handler`, with the global flags (which may follow it too)."""
    sub = commands.add_parser(name, help=help, description=help)
    _global_options(sub, suppress=True)
    sub.set_defaults(handler=handler)
    return sub


def add_tag_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """`--tag KEY=VALUE`, repeatable, into `args.tags` (a list of pairs)."""
    parser.add_argument(
        "--tag",
        dest="tags",
        action="append",
        type=parse_tag,
        default=[],
        metavar="KEY=VALUE",
        help=help,
    )


def add_state_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--state STATE`, repeatable, into `args.states` (a list of `PromiseState`)."""
    parser.add_argument(
        "--state",
        dest="states",
        action="append",
        type=parse_state,
        default=[],
        metavar="STATE",
        help=help,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the `troth` command; return its exit status."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] in (["serve"], ["db"], ["tokens"], ["console"]):
        return _server_command(args_list[0], args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "serve":
        return _server_command("serve", list(args.serve_args))
    if args.command == "db":
        return _server_command("db", list(args.db_args))
    handler: Handler = args.handler
    out = sys.stdout
    try:
        with Client(
            args.server,
            timeout=args.timeout.total_seconds(),
            principal=args.principal,
            tls=_tls_option(args),
            token_file=_token_file(args.token_file),
            multiplex_calls=False,  # a call or two, then exit: no stream to open
        ) as client:
            if threading.current_thread() is not threading.main_thread():
                return handler(client, args, out)
            interrupts = Interrupts()  # Ctrl-C ends the command promptly (_cli_streams)
            interrupts.install()
            try:
                return handler(client, args, out)
            finally:
                interrupts.uninstall()
    except TrothError as exc:
        print(f"troth: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly. Point stdout at
        # devnull so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        return 1


def _tls_option(args: argparse.Namespace) -> TlsConfig | None:
    """`Client(tls=...)` from the flags (whose defaults are the TROTH_TLS_* variables)."""
    # As in Client: files (or --tls) turn TLS on; a server name alone does not.
    if args.tls or args.tls_ca or args.tls_cert or args.tls_key:
        return TlsConfig(
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
            server_name=args.tls_server_name,
        )
    return None


def _token_file(path: str | None) -> str | None:
    """`--token-file` checked, for Client(token_file=...) to read and re-read (a
    long-lived `troth worker` renews its token when the file changes); None without
    a file, so that Client reads TROTH_TOKEN. A file that cannot be used is named by
    its flag here."""
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigurationError(f"--token-file {path}: cannot be read ({why})") from None
    if not token:
        raise ConfigurationError(f"--token-file {path}: is empty; put the bearer token in it")
    return path


def _server_command(command: str, argv: list[str]) -> int:
    """`troth serve` and `troth db`, which troth_server.cli implements."""
    # Imported by name, lazily: the SDK must not depend on troth_server (it
    # brings SQLAlchemy), and a static import would put it in troth's import graph.
    try:
        module = importlib.import_module("troth_server.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("troth_server", "troth_server.cli"):
            raise  # troth-server is installed but broken: show the real problem
        print(_SERVER_MISSING.format(command=command) + INSTALL_SERVER, file=sys.stderr)
        return 1
    entry = cast("Callable[[list[str]], int]", getattr(module, command))
    return entry(argv)


# --- commands ---------------------------------------------------------------


def _cmd_get(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    promise = client.get(args.id)
    _emit_promise(promise, args.json, out)
    return 0


def _cmd_search(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    limit: int = args.limit
    # Ask for no more than needed; the server caps large page sizes itself.
    page_size = min(limit, 1000) if limit else None
    results = client.search_all(
        args.id, states=args.states, tags=dict(args.tags), page_size=page_size
    )
    shown = emit_listing(results, limit, promise_to_json if args.json else None, out)
    if not args.json:
        if shown:
            out.write(format_table(shown))
        else:
            print("no promises match", file=sys.stderr)
    return 0


def emit_listing(
    results: Iterable[Promise],
    limit: int,
    to_json: Callable[[Promise], object] | None,
    out: IO[str],
) -> list[Promise]:
    """Take at most `limit` (0: all) of `results`, writing each as a JSON line
    at once when `to_json` is given; say on stderr when more were left out."""
    shown: list[Promise] = []
    for promise in results:
        if limit and len(shown) == limit:
            print(f"showing the first {limit}; pass --limit 0 for all", file=sys.stderr)
            break
        if to_json is not None:
            _write_json(to_json(promise), out)
        shown.append(promise)
    return shown


_PRUNE_TIMEOUT_S = 3600.0
"""A backlog of millions is pruned in many small transactions: give it time."""


def _cmd_prune(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    calls = connection(client)
    request = promises_pb2.PrunePromisesRequest(
        older_than=timedelta_to_proto(args.older_than), dry_run=args.dry_run
    )
    answer = calls.call(calls.transport.promises.PrunePromises, request, timeout=_PRUNE_TIMEOUT_S)
    counts = {
        "pruned": answer.pruned,
        "workflows": answer.workflows,
        "standalone": answer.standalone,
        "dry_run": answer.dry_run,
    }
    if args.json:
        _write_json(counts, out)
        return 0
    verb = "would prune" if answer.dry_run else "pruned"
    out.write(
        f"{verb} {answer.pruned} promises: {answer.workflows} finished workflows "
        f"(with their steps) and {answer.standalone} standalone promises\n"
    )
    return 0


def _cmd_create(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    result = client.create(
        args.id,
        args.param,
        tags=dict(args.tags),
        ttl=args.ttl,
        never_expires=args.never_expires,
        idempotency_key=args.idempotency_key,
        strict=args.strict,
    )
    _emit_result(result, args.json, out)
    return 0


def _settle_command(action: str) -> Handler:
    def run(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
        if action == "cancel":
            result = client.cancel(
                args.id, args.value, idempotency_key=args.idempotency_key, strict=args.strict
            )
        else:
            settle = client.resolve if action == "resolve" else client.reject
            result = settle(
                args.id,
                args.value,
                idempotency_key=args.idempotency_key,
                strict=args.strict,
                create_if_missing=args.create_if_missing,
            )
        _emit_result(result, args.json, out)
        return 0

    return run


def _cmd_watch(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    max_wait: timedelta | None = args.max_wait
    timeout = max_wait.total_seconds() if max_wait is not None else None
    # Read on a thread; Ctrl-C closes the client's channel, which ends the watch.
    promises = follow(client.watch(args.id, timeout=timeout), client.close)
    for count, promise in enumerate(promises):
        if count and not args.json:
            out.write("\n")
        _emit_promise(promise, args.json, out)
        out.flush()
        if not promise.is_settled and not args.json:
            print(f"waiting for {promise.id} to settle (Ctrl-C to stop)...", file=sys.stderr)
    return 0


# --- output -----------------------------------------------------------------


def _emit_promise(promise: Promise, as_json: bool, out: IO[str]) -> None:
    if as_json:
        _write_json(promise_to_json(promise), out)
    else:
        out.write(format_block(promise))


def _emit_result(result: CreateResult | SettleResult, as_json: bool, out: IO[str]) -> None:
    promise = result.promise
    if isinstance(result, CreateResult):
        flag, happened = "created", result.created
        headline = (
            f"created {promise.id}"
            if happened
            else f"{promise.id} already existed; this create was a repeat and changed nothing"
        )
    else:
        flag, happened = "applied", result.applied
        headline = (
            f"{promise.id} is now {promise.state}"
            if happened
            else f"{promise.id} was already settled by this idempotency key; nothing changed"
        )
    if as_json:
        _write_json({flag: happened, "promise": promise_to_json(promise)}, out)
    else:
        out.write(f"{headline}\n\n{format_block(promise)}")


def _write_json(obj: object, out: IO[str]) -> None:
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")


def payload_to_json(payload: Payload) -> Any:
    """A payload as a JSON-ready value: decoded JSON, None if empty, else base64 with a marker."""
    if not payload.data:
        return None
    if payload.is_json:
        try:
            return json.loads(payload.data)
        except ValueError:
            pass  # mislabelled: fall through to the lossless form
    return {
        "$base64": base64.b64encode(payload.data).decode("ascii"),
        "headers": dict(payload.headers),
    }


def promise_to_json(promise: Promise) -> dict[str, Any]:
    """A promise as a JSON-ready dict, field names as in the proto."""
    return {
        "id": promise.id,
        "state": promise.state.value,
        "param": payload_to_json(promise.param),
        "value": payload_to_json(promise.value),
        "tags": dict(promise.tags),
        "create_time": _iso(promise.create_time),
        "settle_time": _iso(promise.settle_time),
        "expire_time": _iso(promise.expire_time),
        "idempotency_key_for_create": promise.idempotency_key_for_create,
        "idempotency_key_for_settle": promise.idempotency_key_for_settle,
        "settled_by": promise.settled_by,
        "schema": dict(promise.schema) if promise.schema is not None else None,
        "title": promise.title,
        "message": promise.message,
        "requested_by": promise.requested_by,
        "workflow_version": promise.workflow_version,
    }


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _when(moment: datetime | None, absent: str = "-") -> str:
    if moment is None:
        return absent
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def payload_preview(payload: Payload, width: int | None = _PREVIEW_WIDTH) -> str:
    """One line showing a payload: compact JSON, or its size and type; cut to `width`."""
    if not payload.data:
        return "-"
    text: str | None = None
    if payload.is_json:
        try:
            text = json.dumps(json.loads(payload.data), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            text = None
    if text is None:
        kind = payload.content_type or "no content-type"
        text = f"<{len(payload.data)} bytes, {kind}>"
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def format_block(promise: Promise) -> str:
    """A `key: value` block describing one promise, ending in a newline."""
    tags = ", ".join(f"{k}={v}" for k, v in sorted(promise.tags.items())) or "-"
    rows = [
        ("id", promise.id),
        ("state", promise.state.value),
        ("param", payload_preview(promise.param, width=None)),
        ("value", payload_preview(promise.value, width=None)),
        ("tags", tags),
        ("created", _when(promise.create_time)),
        ("expires", _when(promise.expire_time, absent="never")),
        ("settled", _when(promise.settle_time)),
        ("settled by", promise.settled_by or "-"),
        ("create key", promise.idempotency_key_for_create or "-"),
        ("settle key", promise.idempotency_key_for_settle or "-"),
    ]
    # Shown only when set: most promises are not waiting for a human.
    extra = [
        ("title", promise.title),
        ("message", promise.message),
        ("requested by", promise.requested_by),
        ("schema", json.dumps(promise.schema, separators=(",", ":")) if promise.schema else ""),
        ("version", promise.workflow_version),
    ]
    rows += [(label, value) for label, value in extra if value]
    width = max(len(label) for label, _ in rows) + 1
    return "".join(f"{label + ':':<{width}} {value}\n" for label, value in rows)


_COLUMNS = ("ID", "STATE", "CREATED", "EXPIRES", "SETTLED", "VALUE")


def format_table(promises: Iterable[Promise]) -> str:
    """Promises as an aligned table with a header, ending in a newline."""
    rows = [_COLUMNS] + [
        (
            p.id,
            p.state.value,
            _when(p.create_time),
            _when(p.expire_time, absent="never"),
            _when(p.settle_time),
            payload_preview(p.value),
        )
        for p in promises
    ]
    return _align(rows)


def _align(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
