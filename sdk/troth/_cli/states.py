"""`troth workflows state`: read a workflow's state slot, or rewrite it while the run
is parked (an operator's compare-and-swap: `Client.get_state`, `Client.replace_state`).

```
troth workflows state get ID NAME  the slot's value and version, and whether the run is
                                   parked (a rewrite may be made only then)
troth workflows state replace ID NAME --value JSON
                                   write VALUE over the slot if the run is still parked
                                   and the slot still at the version read; a loser says
                                   what it lost to and exits 3
```

With `--json`, `get` writes `{"workflow_id", "name", "version", "value", "update_time",
"updated_by", "parked", "not_parked_because"}` and `replace` `{"won", "based_on",
"lost_to", "message", "state": {...}}`. A rewrite that checks the new value (a
validator) is a Python call: `Client.replace_state(..., validate=...)`.
"""

from __future__ import annotations

import argparse
from typing import IO, TYPE_CHECKING, Any

from troth._cli.args import add_leaf, parse_json
from troth._cli.output import iso, when, write_json

if TYPE_CHECKING:
    from troth._states import WorkflowState
    from troth.client import Client

__all__ = ["add_state_commands", "cmd_state_get", "cmd_state_replace"]

LOST_EXIT = 3
"""`replace`'s exit status when the rewrite lost (nothing was written)."""


def add_state_commands(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Add `workflows state get|replace`."""
    state = actions.add_parser(
        "state", help="read a workflow's state slot, or rewrite it while the run is parked"
    )
    verbs = state.add_subparsers(dest="state_action", metavar="ACTION", required=True)
    get = add_leaf(
        verbs,
        "get",
        "a workflow's state slot: value, version, and whether the run is parked",
        cmd_state_get,
    )
    get.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
    get.add_argument("name", metavar="NAME", help="the slot's name")
    replace = add_leaf(
        verbs,
        "replace",
        "write a new value over a parked workflow's state slot, by compare-and-swap on "
        "its version (needs the operator role)",
        cmd_state_replace,
    )
    replace.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
    replace.add_argument("name", metavar="NAME", help="the slot's name")
    replace.add_argument(
        "--value", required=True, type=parse_json, metavar="JSON", help="the new value (JSON)"
    )


def _state_json(state: WorkflowState) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "workflow_id": state.workflow_id,
        "name": state.name,
        "version": state.version,
        "value": state.value,
        "update_time": iso(state.update_time),
        "updated_by": state.updated_by,
    }
    if state.parked is not None:
        shown["parked"] = state.parked
        shown["not_parked_because"] = state.not_parked_because
    return shown


def cmd_state_get(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    state = client.get_state(args.id, args.name)
    if args.json:
        write_json(_state_json(state), out)
        return 0
    parked = "parked" if state.parked else f"not parked: {state.not_parked_because}"
    by = f" by {state.updated_by}" if state.updated_by else ""
    out.write(
        f"workflow {state.workflow_id} state {state.name!r}: version {state.version}"
        f" (written {when(state.update_time)}{by}); the run is {parked}\n"
    )
    write_json(state.value, out)
    return 0


def cmd_state_replace(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    result = client.replace_state(args.id, args.name, lambda current: args.value)
    if args.json:
        write_json(
            {
                "won": result.won,
                "based_on": result.based_on,
                "lost_to": result.lost_to.value,
                "message": result.message,
                "state": _state_json(result.state),
            },
            out,
        )
    elif result.won:
        out.write(
            f"workflow {args.id} state {args.name!r}: version {result.based_on} -> "
            f"{result.state.version}\n"
        )
    else:
        out.write(f"not written: lost to {result.lost_to.value}: {result.message}\n")
    return 0 if result.won else LOST_EXIT
