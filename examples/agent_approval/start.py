"""Start an agent run: `python start.py RUN_ID TOPIC --channel blog [--channel newsletter] ...`.

Starting is idempotent by id: a second start of RUN_ID answers the run that
exists (its first arguments win). `report.py RUN_ID` shows how it went.
Settings from the environment: `TROTH_SERVER` (default 127.0.0.1:7070),
`TROTH_TOKEN` (a token with role `gateway`; its principal is the run's starter)
and `TROTH_GROUP` (default `agents`). `--approver NAME` (repeatable; default
`editor`) names who may approve the run's publishes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import timedelta

from agent import (
    DEFAULT_APPROVAL_TIMEOUT,
    DEFAULT_APPROVERS,
    DEFAULT_MAX_TURNS,
    DEFAULT_TOKEN_BUDGET,
    agent,
)

from troth import Client, TrothError

RUN_TTL = timedelta(days=7)
"""How long a run may take in all, approvals included."""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Start an agent run (see README.md).")
    parser.add_argument("run_id", help="the run's id, e.g. agent-1 (its approvals are agent-1.*)")
    parser.add_argument("topic", help="what the post is about")
    parser.add_argument(
        "--channel", action="append", required=True, help="where to publish; repeat for more"
    )
    parser.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS)
    parser.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    parser.add_argument(
        "--approval-timeout",
        type=float,
        default=DEFAULT_APPROVAL_TIMEOUT,
        help="seconds an editor has to decide on each publish (at most a day)",
    )
    parser.add_argument(
        "--approver",
        action="append",
        metavar="PRINCIPAL",
        help=f"who may approve a publish; repeat for more (default {', '.join(DEFAULT_APPROVERS)})",
    )
    args = parser.parse_args(argv)
    if args.max_turns < 1 or args.token_budget < 1 or args.approval_timeout <= 0:
        parser.error("--max-turns, --token-budget and --approval-timeout must be above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    group = os.environ.get("TROTH_GROUP", "agents")
    try:
        with Client(os.environ.get("TROTH_SERVER", "127.0.0.1:7070")) as client:
            handle = client.start(
                agent,
                args.topic,
                args.channel,
                args.max_turns,
                args.token_budget,
                args.approval_timeout,
                args.approver or list(DEFAULT_APPROVERS),
                id=args.run_id,
                group=group,
                ttl=RUN_TTL,
            )
    except TrothError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"started {handle.id}; its approvals, once the model asks to publish:")
    print(f"  troth approvals list --tag agent={handle.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
