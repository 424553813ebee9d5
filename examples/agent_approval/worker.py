"""The worker of the agent-approval example: serves the `agent` and `run_tool` workflows.

Run it from this folder (see README.md):

    TROTH_SERVER=127.0.0.1:7070 AGENT_JOURNAL=journal.jsonl python worker.py

Settings, all from the environment:

- `TROTH_SERVER`: the troth server, host:port (default 127.0.0.1:7070).
- `TROTH_TOKEN`: the worker's bearer token (role `worker`, group `agents`).
- `TROTH_GROUP`: the worker group to serve (default `agents`).
- `AGENT_JOURNAL`: the file every model call, tool run and published post
  appends a JSON line to (default `journal.jsonl`).
"""

from __future__ import annotations

import logging
import os

from agent import agent, run_tool

from troth import Client, Worker

__all__ = ["build_worker", "main"]

_log = logging.getLogger("agent_approval.worker")


def build_worker(client: Client, group: str = "agents") -> Worker:
    """A worker of `group` with both workflows registered (tools run as child workflows)."""
    worker = Worker(client, group=group)
    worker.workflow(agent)
    worker.workflow(run_tool)
    return worker


def main() -> None:
    """Serve the group until SIGINT or SIGTERM (then stop gracefully)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    address = os.environ.get("TROTH_SERVER", "127.0.0.1:7070")
    group = os.environ.get("TROTH_GROUP", "agents")
    with Client(address) as client:
        worker = build_worker(client, group)
        _log.info("agent worker for group %r of %s; Ctrl-C to stop", group, address)
        worker.run()


if __name__ == "__main__":
    main()
