"""The worker of the tool-loop example: serves `tool_loop` for group `tools`.

TROTH_SERVER=127.0.0.1:7070 python worker.py
"""

from __future__ import annotations

import logging
import os

from loop import tool_loop

from troth import Client, Worker


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with Client(os.environ.get("TROTH_SERVER", "127.0.0.1:7070")) as client:
        worker = Worker(client, group=os.environ.get("TROTH_GROUP", "tools"))
        worker.workflow(tool_loop)
        worker.run()


if __name__ == "__main__":
    main()
