"""Show an agent run: `python report.py RUN_ID [--wait SECONDS] [--json]`.

While the run goes on, it prints the approvals the run waits for, with
their drafts (exit status 3). Once the run has finished: the conversation as
a chat log, turns and tokens spent, and why it stopped early if it did.
`--wait` first waits up to that long for the run to finish, or, with
`--approvals N`, until N approvals of the run wait for an editor (the model and
the tools have got that far: for scripts and the README); `--json` prints
the finished report as JSON (for scripts). Exit status 1: the run failed or
was not found. Settings from the environment: `TROTH_SERVER` (default
127.0.0.1:7070) and `TROTH_TOKEN` (a token with role `gateway`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent import APPROVAL_TAG

from troth import Client, DeadlineExceededError, Promise, PromiseState, TrothError

_WIDTH = 100


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return text if len(text) <= _WIDTH else text[: _WIDTH - 1] + "…"


def render(run_id: str, report: Mapping[str, Any]) -> str:
    """The report as text: a summary line, the chat log, and why it stopped early (if it did)."""
    lines = [
        f"{run_id}: {report['status']} after {report['turns']} turns, {report['tokens']} tokens"
    ]
    for message in report["transcript"]:
        role = message["role"]
        if role == "tool":
            lines.append(f"  tool {message['name']} ({message['tool_call_id']}): "
                         f"{_short(message['content'])}")  # fmt: skip
            continue
        lines.append(f"  {role}: {message['content']}")
        for call in message.get("tool_calls") or []:
            lines.append(f"    -> {call['id']} {call['name']}({_short(call['args'])})")
    if report["stopped"]:
        lines.append(f"stopped: {report['stopped']}")
    return "\n".join(lines)


def waiting(client: Client, run_id: str) -> str:
    """The run's approvals waiting for an editor, each with its draft."""
    pending = client.search_all(
        f"{run_id}.*", tags={"approval": APPROVAL_TAG}, states=[PromiseState.PENDING]
    )
    lines = []
    for approval in pending:
        lines.append(f"waiting: {approval.id}  {approval.title}")
        lines += [f"    {line}" for line in approval.message.splitlines()]
    return "\n".join(lines) if lines else "(no approval waits; the model or a tool is busy)"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Show an agent run (see README.md).")
    parser.add_argument("run_id", help="the run's id, as given to start.py")
    parser.add_argument("--wait", type=float, default=0, help="wait this long for it to finish")
    parser.add_argument(
        "--approvals",
        type=int,
        metavar="N",
        help="with --wait: wait until N approvals wait for an editor instead (or the run ended)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.approvals is not None and (args.approvals < 1 or not args.wait):
        parser.error("--approvals needs a count above 0 and --wait SECONDS")
    return args


def pending_approvals(client: Client, run_id: str) -> int:
    found = client.search_all(
        f"{run_id}.*", tags={"approval": APPROVAL_TAG}, states=[PromiseState.PENDING]
    )
    return sum(1 for _ in found)


def wait_for_approvals(client: Client, run_id: str, count: int, timeout: float) -> Promise:
    """The run's root once `count` of its approvals are pending, it ended, or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while True:
        root = client.get(run_id)
        if root.is_settled or pending_approvals(client, run_id) >= count:
            return root
        if time.monotonic() > deadline:
            return root
        time.sleep(0.1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        with Client(os.environ.get("TROTH_SERVER", "127.0.0.1:7070")) as client:
            root = client.get(args.run_id)
            if args.approvals and not root.is_settled:
                root = wait_for_approvals(client, args.run_id, args.approvals, args.wait)
            elif args.wait and not root.is_settled:
                try:
                    root = client.wait(args.run_id, timeout=args.wait)
                except DeadlineExceededError:
                    root = client.get(args.run_id)
            if not root.is_settled:
                print(f"{args.run_id} is still running")
                print(waiting(client, args.run_id))
                return 3
            value = client.decode(root.value)
    except TrothError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if root.state is not PromiseState.RESOLVED:
        print(f"{args.run_id} ended {root.state}: {json.dumps(value)}", file=sys.stderr)
        return 1
    print(json.dumps(value, indent=2) if args.json else render(args.run_id, value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
