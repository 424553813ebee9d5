"""Wait for a tool loop's result and print it: `python report.py WORKFLOW_ID [--wait S]`."""

from __future__ import annotations

import argparse
import os

from troth import Client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workflow_id")
    parser.add_argument("--wait", type=float, default=30.0)
    args = parser.parse_args()
    with Client(os.environ.get("TROTH_SERVER", "127.0.0.1:7070")) as client:
        result = client.handle(args.workflow_id).result(timeout=args.wait)
    print(f"answer: {result['answer']}")


if __name__ == "__main__":
    main()
