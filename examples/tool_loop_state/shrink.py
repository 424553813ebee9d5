"""An operator shrinks a parked tool loop's thread: `python shrink.py WORKFLOW_ID`.

Waits (up to `--wait` seconds) until the run is parked on its approval, then tries the
five rewrites the loop could not resume from (each refused, nothing written), then a
good one: the long search result replaced by a summary, by compare-and-swap.
Exit status: 0 when the rewrite was written, 3 when it lost (it says to what).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from typing import Any

from thread import THREAD, UnresumableThread, pending_calls, replace_thread

from troth import Client

Thread = list[dict[str, Any]]


def _summarized(thread: Thread) -> Thread:
    shrunk = copy.deepcopy(thread)
    for message in shrunk:
        if message["role"] == "tool" and len(message["content"]) > 200:
            lines = message["content"].count("\n") + 1
            message["content"] = f"[{lines} search results, summarized by an operator]"
    return shrunk


BAD_REWRITES = {
    "drop the search result": lambda t: [m for m in t if m.get("tool_call_id") != "call-1"],
    "move the search result first": lambda t: [t[2], t[0], t[1], *t[3:]],
    "call search twice": lambda t: [
        *t[:2],
        {**t[1], "tool_calls": [t[1]["tool_calls"][0]]},
        *t[2:],
    ],
    "start afresh": lambda t: [],
    "drop the deferred publish": lambda t: [
        t[0],
        {**t[1], "tool_calls": [t[1]["tool_calls"][0]]},
        *t[2:],
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workflow_id")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for it to park")
    args = parser.parse_args()
    with Client(os.environ.get("TROTH_SERVER", "127.0.0.1:7070")) as client:
        deadline = time.monotonic() + args.wait
        while True:
            state = client.get_state(args.workflow_id, THREAD)
            if state.parked and state.value and pending_calls(state.value):
                break
            if time.monotonic() > deadline:
                print(f"{args.workflow_id} did not park on an approval within {args.wait:g} s")
                return 2
            time.sleep(0.1)
        print(f"parked at version {state.version}, waiting on {pending_calls(state.value)}")
        for what, bad in BAD_REWRITES.items():
            try:
                replace_thread(client, args.workflow_id, bad)
            except UnresumableThread as refused:
                print(f"refused ({refused.rule}) {what}: {refused}")
            else:
                print(f"BUG: {what} was written")
                return 1
        result = replace_thread(client, args.workflow_id, _summarized)
        if not result.won:
            print(f"lost to {result.lost_to.value}: {result.message}")
            return 3
        print(f"shrunk: version {result.based_on} -> {result.state.version}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
