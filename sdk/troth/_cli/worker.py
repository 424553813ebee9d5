"""`troth worker MODULE[:ATTR]`: run a worker from the command line, logging what it does.

```
troth [--server ADDR] [--tls-ca FILE] [--token-file FILE] worker MODULE[:ATTR]
      [--group G] [--path DIR] [--log-level info]
```

MODULE is a dotted module name or a `.py` file (`troth._modules`). ATTR, or
without it the one `Worker` the module defines at top level, else its
`build_worker` function, is either:

- a `Worker`: it runs as it is (with the `Client` it was built with);
- a factory `build_worker(client, group=...)` returning a `Worker`: called with
  a `Client` built from the command line's flags (`--server`, TLS, token), and
  `group=` when `--group` is given.

Logging is configured before the worker starts (`--log-level`, default INFO,
to stderr), so a user sees what it does; Ctrl-C stops it as `Worker.run()`
says (the first waits for running steps and says for which, the second stops
at once).
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import IO, TYPE_CHECKING, Any

from troth._cli.args import add_leaf
from troth._foreground import LOG_FORMAT
from troth._modules import UsageError, add_import_paths, import_module, split_spec
from troth.errors import TrothError
from troth.worker import Worker

if TYPE_CHECKING:
    import argparse
    from types import ModuleType

    from troth.client import Client

__all__ = ["add_commands", "find_worker"]

FACTORY = "build_worker"
"""The factory `troth worker MODULE` calls when the module defines no Worker."""

_LEVELS = ("debug", "info", "warning", "error")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `worker` to the `troth` command line."""
    worker = add_leaf(
        commands,
        "worker",
        "run a worker: the Worker in MODULE[:ATTR], or the one its build_worker(client, "
        "group=...) builds with a client from these flags; logs to stderr",
        _cmd_worker,
    )
    worker.add_argument(
        "spec",
        metavar="MODULE[:ATTR]",
        help="a dotted module name or a .py file; ATTR names a Worker or a factory "
        f"(client, group=...) -> Worker (default: the module's one Worker, else {FACTORY})",
    )
    worker.add_argument(
        "--group",
        help="the group to poll, passed to the factory as group=... "
        "(a Worker instance keeps its own)",
    )
    worker.add_argument(
        "--path",
        dest="paths",
        metavar="DIR",
        action="append",
        default=[],
        help="add DIR to the import path first (repeatable)",
    )
    worker.add_argument(
        "--log-level",
        choices=_LEVELS,
        default="info",
        help="the lowest level logged to stderr (default %(default)s)",
    )


def _cmd_worker(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    try:
        worker = find_worker(client, args.spec, args.paths, group=args.group)
    except UsageError as exc:
        print(f"troth worker: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), stream=sys.stderr, format=LOG_FORMAT
    )
    try:
        worker.run()
    except TrothError as exc:
        if exc is not worker.failure:
            raise
        return 1  # refused for good: the worker's ERROR line said why and what to do
    return 0


def find_worker(
    client: Client, spec: str, paths: list[str] | None = None, *, group: str | None = None
) -> Worker:
    """The worker `MODULE[:ATTR]` names: a `Worker`, or the one its factory builds with
    `client` (and `group=`, when given). Raises UsageError saying what was found."""
    add_import_paths(paths or ())
    module_name, attr = split_spec(spec)
    module = import_module(module_name)
    value = _named(module, attr, spec)
    if isinstance(value, Worker):
        if group is not None and group != value.group:
            raise UsageError(
                f"{spec} is a Worker of group {value.group!r}; --group {group} applies only "
                f"to a factory ({FACTORY}(client, group=...)): drop it, or name a factory"
            )
        return value
    built = value(client) if group is None else value(client, group=group)
    if not isinstance(built, Worker):
        raise UsageError(f"{spec}: the factory returned {type(built).__name__}, not a troth.Worker")
    return built


def _named(module: ModuleType, attr: str | None, spec: str) -> Any:
    if attr is not None:
        if not hasattr(module, attr):
            raise UsageError(f"{spec}: module {module.__name__} has no {attr!r}")
        value = getattr(module, attr)
        if isinstance(value, Worker) or _is_factory(value):
            return value
        raise UsageError(
            f"{spec}: {attr} (of type {type(value).__name__}) is not a Worker nor a "
            "factory (client, group=...) -> Worker"
        )
    workers = {name: v for name, v in vars(module).items() if isinstance(v, Worker)}
    if len(workers) == 1:
        return next(iter(workers.values()))
    if len(workers) > 1:
        names = ", ".join(sorted(workers))
        raise UsageError(
            f"{spec}: the module defines several Workers ({names}); name one: "
            f"{spec}:{sorted(workers)[0]}"
        )
    factory = getattr(module, FACTORY, None)
    if _is_factory(factory):
        return factory
    raise UsageError(
        f"{spec}: the module defines no Worker at top level and no {FACTORY}(client, "
        "group=...) function; define one, or name it with MODULE:ATTR"
    )


def _is_factory(value: object) -> bool:
    return callable(value) and not inspect.isclass(value) and not isinstance(value, Worker)
