"""`troth export` and `troth replay`: check changed workflow code against recorded histories.

```
troth export ID [ID ...] [-o PATH]
troth export --search GLOB [--tag k=v ...] [--state S ...] [-o PATH]
troth replay --workflows MODULE[:ATTR] [--path DIR ...] FILE_OR_DIR [...]
troth replay --workflows MODULE[:ATTR] [--path DIR ...] --id ID [ID ...]
troth replay --workflows MODULE[:ATTR] [--path DIR ...] --search GLOB [--tag k=v] [--state S]
```

Export reads each workflow root (given by id, or every promise matching the
search that is a workflow root: tagged `troth:func` and `troth:invoke`) and
all its steps (by record, `parent_id`: steps with explicit ids too) and
writes them as history JSON in the shape `troth.testing` documents. To stdout
or a file (`-o FILE`) it writes one JSON list of histories; to a directory
(`-o DIR/`, or an existing directory) one file per workflow, `<root id>.json`
(`/` and `:` in ids percent-encoded).

Replay imports the workflow code (`--workflows`, see `load_workflows`),
reads the histories (files, directories of `*.json` files, or straight from
the server), looks each workflow up by its recorded name and replays it with
`troth.testing.replay_history`, running no step. It prints one line per
history: OK and where the recorded history ends, or the first divergent step
with its position, id and both commands. With `--json`, one object per line.

Exit status of replay: 0 every history replays, 1 at least one diverges, 2
nothing was checked: bad command line, unreadable or malformed file, a
workflow name the code does not have, the module failed to import, or the
server could not be read. Export: 0, 1 when the server refused or could not
be reached, 2 for a bad command line or an id that is not a workflow.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

from troth._cli.args import add_leaf, add_state_option, add_tag_option
from troth._cli.output import payload_to_json, write_json
from troth._engine import CreateStep, Done, Failed, Outcome, Suspend, Workflow, describe_tags
from troth._modules import UsageError, add_import_paths, import_module, split_spec
from troth._tags import TAG_FUNC, TAG_INVOKE, is_workflow_root
from troth.errors import NonDeterminismError, TrothError
from troth.testing import HISTORY_FORMAT, History, load_histories, replay_history_counted
from troth.worker import Worker

if TYPE_CHECKING:
    from troth._promise import Promise
    from troth.client import Client

__all__ = [
    "CheckResult",
    "UsageError",
    "add_commands",
    "check_history",
    "describe_outcome",
    "history_to_json",
    "load_workflows",
    "render_result",
]

_PAGE_SIZE = 1000  # the server caps it at its own maximum
_FILENAME_SAFE = "._~@+=-"


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `export` and `replay` to the `troth` command line."""

    export = add_leaf(
        commands,
        "export",
        "write workflows' recorded histories (root and steps) as JSON, for `troth replay`",
        _cmd_export,
    )
    export.add_argument("ids", metavar="ID", nargs="*", help="workflow (root promise) ids")
    _search_options(export)
    export.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="a file (one JSON list) or a directory, existing or written DIR/ "
        "(one <id>.json per workflow); default stdout",
    )

    replay = add_leaf(
        commands,
        "replay",
        "replay recorded histories against the current workflow code; exit 1 if one diverges",
        _cmd_replay,
    )
    replay.add_argument(
        "files",
        metavar="FILE",
        nargs="*",
        help="history files written by `troth export`, or directories of *.json files",
    )
    replay.add_argument(
        "--workflows",
        metavar="MODULE[:ATTR]",
        action="append",
        required=True,
        help="the module (dotted name or .py file) with your Worker or workflow functions; "
        "ATTR names a Worker, a dict of workflows or one function (repeat for several)",
    )
    replay.add_argument(
        "--path",
        dest="paths",
        metavar="DIR",
        action="append",
        default=[],
        help="add DIR to the import path first (repeatable)",
    )
    replay.add_argument(
        "--id",
        dest="ids",
        metavar="ID",
        nargs="+",
        action="extend",
        default=[],
        help="read these workflows' histories from the server",
    )
    _search_options(replay)


def _search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--search",
        metavar="GLOB",
        help="every workflow whose id matches (`*` matches any run), from the server",
    )
    add_tag_option(parser, "with --search: only roots with this tag, e.g. troth:func=publish")
    add_state_option(
        parser, "with --search: only roots in this state, e.g. PENDING (workflows in flight)"
    )


# --- export -------------------------------------------------------------------


def _cmd_export(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    try:
        _check_sources(args, files=False)
        roots = _roots(client, args)
        histories = [_fetch(client, root) for root in roots]
        _write_histories(histories, args.output, out)
    except UsageError as exc:
        print(f"troth export: error: {exc}", file=sys.stderr)
        return 2
    if not histories:
        print("no workflows match; nothing exported", file=sys.stderr)
    elif args.output:
        count = _plural(len(histories), "workflow", "workflows")
        print(f"exported {count} to {args.output}", file=sys.stderr)
    return 0


def _write_histories(histories: list[dict[str, Any]], output: str | None, out: IO[str]) -> None:
    if output is None:
        out.write(_dumps(histories))
        return
    target = Path(output)
    if output.endswith(("/", os.sep)) or target.is_dir():
        try:
            target.mkdir(parents=True, exist_ok=True)
            for history in histories:
                name = quote(history["root_id"], safe=_FILENAME_SAFE) + ".json"
                (target / name).write_text(_dumps(history), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write to {output}: {exc.strerror or exc}") from None
        return
    try:
        target.write_text(_dumps(histories), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None


def _dumps(data: object) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def history_to_json(root: Promise, descendants: Iterable[Promise]) -> dict[str, Any]:
    """A workflow's root and descendants as a history object (`troth.testing`'s format)."""
    args = payload_to_json(root.param)
    return {
        "format": HISTORY_FORMAT,
        "workflow": root.tags.get(TAG_FUNC, ""),
        "root_id": root.id,
        "args": [] if args is None else args,
        "root": _promise_json(root),
        "promises": [_promise_json(promise) for promise in descendants],
    }


def _promise_json(promise: Promise) -> dict[str, Any]:
    # Only what replay reads, plus what helps a person reading the file; full
    # precision times, since the order of settle times decides `ctx.any`.
    item: dict[str, Any] = {"id": promise.id, "state": promise.state.value}
    item["tags"] = dict(sorted(promise.tags.items()))
    if promise.param.data:
        item["param"] = payload_to_json(promise.param)
    if promise.value.data:
        item["value"] = payload_to_json(promise.value)
    for key, moment in (
        ("create_time", promise.create_time),
        ("settle_time", promise.settle_time),
        ("expire_time", promise.expire_time),
    ):
        if moment is not None:
            item[key] = moment.isoformat().replace("+00:00", "Z")
    if promise.parent_id:
        item["parent_id"] = promise.parent_id  # a step of this workflow, named or not
    if promise.settled_by:
        item["settled_by"] = promise.settled_by
    if promise.workflow_version:
        item["workflow_version"] = promise.workflow_version
    return item


def _roots(client: Client, args: argparse.Namespace) -> list[Promise]:
    if args.ids:
        roots = [client.get(root_id) for root_id in dict.fromkeys(args.ids)]
        for root in roots:
            if not is_workflow_root(root.tags):
                raise UsageError(
                    f"{root.id} is not a workflow: it has no {TAG_FUNC} and {TAG_INVOKE} tags "
                    "(give the id a workflow was started with, not one of its steps)"
                )
        return roots
    found = client.search_all(
        args.search, states=args.states, tags=dict(args.tags), page_size=_PAGE_SIZE
    )
    return [promise for promise in found if is_workflow_root(promise.tags)]


def _fetch(client: Client, root: Promise) -> dict[str, Any]:
    # The root is read before its steps: a workflow that ends meanwhile then
    # shows a pending root with all its steps, which replays fine, never an
    # ended root missing its last steps, which would read as a change.
    # By record (parent_id), as a worker's delivery reads it: steps with explicit
    # ids are the workflow's too, and `<root>.x` may be anyone's.
    descendants = client.search_all(parent_id=root.id, page_size=_PAGE_SIZE)
    return history_to_json(root, descendants)


def _check_sources(args: argparse.Namespace, *, files: bool) -> None:
    given = [bool(args.ids), args.search is not None] + ([bool(args.files)] if files else [])
    what = "history FILEs, --id or --search" if files else "IDs or --search"
    if sum(given) != 1:
        raise UsageError(f"give {what} (one of them)")
    if (args.tags or args.states) and args.search is None:
        raise UsageError("--tag and --state filter a --search; add --search GLOB")


# --- replay -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One history replayed: where it ended, or where it diverged.

    Attributes:
        history: The history.
        source: Where it was read from (a file path, or "server").
        outcome: Where the replay stopped when it did not diverge.
        divergence: The first divergent step, if any.
        replayed: The recorded steps the code reached and was answered from
            (named steps too); 0 when it diverged.
    """

    history: History
    source: str
    outcome: Outcome | None = None
    divergence: NonDeterminismError | None = None
    replayed: int = 0


def check_history(history: History, workflow: Workflow, source: str = "") -> CheckResult:
    """Replay `history` against `workflow`: the result, divergent or not."""
    try:
        outcome, replayed = replay_history_counted(history, workflow)
    except NonDeterminismError as error:
        return CheckResult(history, source, divergence=error)
    return CheckResult(history, source, outcome=outcome, replayed=replayed)


def render_result(result: CheckResult) -> str:
    """One line for a person: OK and where the history ends, or the first divergent step."""
    history = result.history
    head = f"history {history.root_id} ({history.workflow})"
    error = result.divergence
    if error is None:
        assert result.outcome is not None
        replayed = _plural(result.replayed, "step", "steps")
        return f"{head}: OK, {replayed} replayed; {describe_outcome(result.outcome)}"
    where = f"id {error.step_id}" if error.step_id else "no id"
    if error.recorded is None:
        state = history.root.state.value if history.root is not None else "ended"
        recorded = f"nothing there (the recorded run had ended: its root is {state})"
        yielded = f"{error.yielded} ({where})"
    else:
        recorded = f"{error.recorded} ({where})"
        yielded = error.yielded or (
            f"nothing there (it returns, raises or waits before reaching step {error.position})"
        )
    return (
        f"{head}: step {error.position} diverges: recorded {recorded}, "
        f"the code now yields {yielded}"
    )


def describe_outcome(outcome: Outcome) -> str:
    """Where a replay that did not diverge stopped, in words."""
    if isinstance(outcome, Done):
        return "the workflow returns"
    if isinstance(outcome, Failed):
        error = outcome.error
        return f"the workflow raises {type(error).__name__}: {error}"
    if isinstance(outcome, Suspend):
        return "it waits on " + ", ".join(outcome.awaiting)
    assert isinstance(outcome, CreateStep)
    verb = "runs again" if outcome.exists else "creates"
    return f"next it {verb} step {outcome.position}: {describe_tags(outcome.tags)}"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _result_json(result: CheckResult) -> dict[str, Any]:
    error = result.divergence
    return {
        "history": result.history.root_id,
        "workflow": result.history.workflow,
        "source": result.source,
        "ok": error is None,
        "replayed": result.replayed,
        "outcome": describe_outcome(result.outcome) if result.outcome is not None else None,
        "divergence": None
        if error is None
        else {
            "position": error.position,
            "step_id": error.step_id,
            "recorded": error.recorded,
            "yielded": error.yielded,
        },
        "message": render_result(result),
    }


def _cmd_replay(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    try:
        _check_sources(args, files=True)
        registry = load_workflows(args.workflows, args.paths)
        histories = _read_histories(client, args)
        _check_names(histories, registry)
    except UsageError as exc:
        print(f"troth replay: error: {exc}", file=sys.stderr)
        return 2
    except TrothError as exc:
        # Nothing was checked: not a divergence, so not exit status 1.
        print(
            f"troth replay: error: cannot read the histories from the server: {exc}",
            file=sys.stderr,
        )
        return 2
    results = [
        check_history(history, registry[history.workflow], source) for source, history in histories
    ]
    diverged = sum(1 for result in results if result.divergence is not None)
    for result in results:
        if args.json:
            write_json(_result_json(result), out)
        else:
            out.write(render_result(result) + "\n")
    if not args.json:
        checked = _plural(len(results), "history", "histories")
        out.write(f"{checked} checked: {len(results) - diverged} OK, {diverged} diverged\n")
    return 1 if diverged else 0


def _read_histories(client: Client, args: argparse.Namespace) -> list[tuple[str, History]]:
    histories: list[tuple[str, History]] = []
    if args.files:
        for path in _history_files(args.files):
            try:
                loaded = load_histories(path)
            except OSError as exc:
                raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"{path} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                    "give files written by `troth export`"
                ) from None
            except ValueError as exc:
                raise UsageError(f"{path} is not a troth history: {exc}") from None
            histories.extend((str(path), history) for history in loaded)
    else:
        for root in _roots(client, args):
            try:
                (history,) = load_histories(_fetch(client, root))
            except ValueError as exc:  # e.g. a root whose param is not a list of arguments
                raise UsageError(f"workflow {root.id} on the server: {exc}") from None
            histories.append(("server", history))
    if not histories:
        raise UsageError("no histories to check: the files hold none, or no workflow matches")
    return histories


def _history_files(names: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise UsageError(f"directory {name} has no *.json history files")
            files.extend(found)
        elif not path.exists():
            raise UsageError(f"no such file: {name}")
        else:
            files.append(path)
    return files


def _check_names(histories: list[tuple[str, History]], registry: Mapping[str, Workflow]) -> None:
    known = ", ".join(sorted(registry)) or "none"
    for source, history in histories:
        if not history.workflow:
            raise UsageError(
                f"{source}: history {history.root_id} names no workflow "
                '(no "workflow" key and no root with a troth:func tag); add "workflow": "NAME"'
            )
        if history.workflow not in registry:
            raise UsageError(
                f"{source}: history {history.root_id} was recorded by workflow "
                f"{history.workflow!r}, which the --workflows code does not have (it has: "
                f"{known}); point --workflows at the module that registers it"
            )


# --- finding the workflow code --------------------------------------------------


def load_workflows(specs: Sequence[str], paths: Sequence[str] = ()) -> dict[str, Workflow]:
    """The workflows, by name, that `--workflows MODULE[:ATTR]` options name.

    MODULE is a dotted module name (importable from `paths` or the current
    directory, which go first on `sys.path`) or a `.py` file (imported as a
    script is run: its directory goes on `sys.path`; `if __name__ ==
    "__main__":` blocks do not run).
    ATTR names a `Worker` (its registered workflows), a mapping of names to
    workflow functions, or one workflow function (by its `__name__`).
    Without ATTR: the workflows registered on the `Worker` objects the module
    defines at top level, or, if it defines none, its generator functions.

    Raises:
        UsageError: A module cannot be imported, names nothing, or two
            modules give one name to different functions.
    """
    add_import_paths(paths)
    registry: dict[str, Workflow] = {}
    origin: dict[str, str] = {}
    for spec in specs:
        module_name, attr = split_spec(spec)
        module = import_module(module_name)
        for name, workflow in _workflows_in(module, attr, spec).items():
            if name in registry and registry[name] is not workflow:
                raise UsageError(
                    f"workflow {name!r} is in both --workflows {origin[name]} and {spec}; "
                    "give only the module that runs it"
                )
            registry[name] = workflow
            origin[name] = spec
    return registry


def _workflows_in(module: ModuleType, attr: str | None, spec: str) -> dict[str, Workflow]:
    if attr is not None:
        if not hasattr(module, attr):
            raise UsageError(f"--workflows {spec}: module {module.__name__} has no {attr!r}")
        found = _workflows_of(getattr(module, attr))
        if found is None:
            kind = type(getattr(module, attr)).__name__
            raise UsageError(
                f"--workflows {spec}: {attr} (of type {kind}) is not a Worker, a dict of "
                "workflow functions or a workflow function; name one of those"
            )
        return found
    workers = [value for value in vars(module).values() if isinstance(value, Worker)]
    if workers:
        registry: dict[str, Workflow] = {}
        for worker in workers:
            registry.update(worker.workflows)
        return registry
    functions = {
        name: value
        for name, value in vars(module).items()
        if inspect.isgeneratorfunction(value) and value.__module__ == module.__name__
    }
    if not functions:
        raise UsageError(
            f"--workflows {spec}: the module defines no Worker and no workflow (generator) "
            "functions at top level; name them with MODULE:ATTR"
        )
    return functions


def _workflows_of(value: object) -> dict[str, Workflow] | None:
    if isinstance(value, Worker):
        return dict(value.workflows)
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and callable(v) for k, v in value.items()):
            return dict(value)
        return None
    if inspect.isgeneratorfunction(value):
        return {value.__name__: value}
    return None
