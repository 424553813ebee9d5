"""A worker keeps running workflows across a rotation of its token (issue 26 item 2).

The worker process reads its token from a file (`Client(token_file=...)`). While it
holds a task inside a step, the token is rotated: the principal's entry in the
server's token file is replaced (SIGHUP: the old token is refused), then the new
token is written to the worker's file (which it reads again within a second, or at
once when the server refuses the old one). The held task's step result is recorded
and the workflow completes (its lease heartbeated with the new token, on a `Calls`
stream opened with it); a workflow started after the rotation runs (delivered on the
`Poll` stream opened with the old token: a server that ends it at the revocation has
it reopened with the new one); and after a server restart, which breaks every
stream, the worker reconnects with the new token (the old one would be refused for
good) and runs another. No token reaches the worker's log.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_worker_token_rotation.py ADDRESS TOKEN_FILE`). Run on SQLite only: the
store plays no part in what the SDK sends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import grpc

from troth import Client, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _auth import bearer, code_and_reason
from _support import ServerProcess, eventually, start_server
from _workers import RELEASE_ENV, WorkerFleet, mail_flow

from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server.auth import mint

GROUP = "rotation"
LEASE = timedelta(seconds=3)


# -- the worker process (run as a script) ------------------------------------------------


def main(address: str, token_file: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address, timeout=5, token_file=token_file) as client:
        worker = Worker(client, group=GROUP, lease=LEASE)
        worker.workflow(mail_flow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


# -- the test ------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def _refused(server: ServerProcess, token: str) -> bool:
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        code, _ = code_and_reason(
            lambda: stub.GetPromise(
                promises_pb2.GetPromiseRequest(id="none"), metadata=bearer(token), timeout=10
            )
        )
    return code is grpc.StatusCode.UNAUTHENTICATED


def test_a_worker_goes_on_across_a_rotation_of_its_token(tmp_path: Path) -> None:
    tokens_path = tmp_path / "tokens.toml"
    gateway = mint("gateway-1", ["gateway"])
    old = mint("worker-1", ["worker"], [GROUP])
    _write(tokens_path, f"{gateway.entry}\n{old.entry}")
    workdir = tmp_path / "server"
    server = start_server(workdir, "--auth-tokens", str(tokens_path), "--sweep-interval", "200ms")
    restarted: ServerProcess | None = None
    worker_token = tmp_path / "worker.token"
    _write(worker_token, old.token + "\n")
    release = tmp_path / "release"
    fleet = WorkerFleet(tmp_path, __file__, server.address)
    try:
        fleet.start(str(worker_token), env={RELEASE_ENV: str(release)})
        run = uuid.uuid4().hex[:6]
        held = f"rot-{run}-held"
        with Client(server.address, timeout=10, token=gateway.token) as client:
            client.start("mail_flow", id=held, group=GROUP)
            fleet.eventually(
                lambda: any(line.startswith(f"{held} email ") for line in fleet.lines()),
                30,
                "the held step to start",
            )
            # The rotation, while the worker holds the task inside its step: the
            # principal's entry is replaced on the server (the old token is refused
            # from now on), then the worker's file is (its heartbeats, refused until
            # then, look at the file again: it sends the new token within a second).
            new = mint("worker-1", ["worker"], [GROUP])
            _write(tokens_path, f"{gateway.entry}\n{new.entry}")
            server.proc.send_signal(signal.SIGHUP)
            eventually(lambda: _refused(server, old.token), what="the old token refused")
            _write(worker_token, new.token + "\n")
            fleet.eventually(lambda: "gave a new token" in fleet.logs(), 30, "the new token")
            release.touch()
            assert client.handle(held).result(timeout=60) == "sent"
            after = f"rot-{run}-after"
            client.start("mail_flow", id=after, group=GROUP)
            assert client.handle(after).result(timeout=60) == "sent"
        # A restart breaks every stream: the worker reopens them with the new token.
        server.kill()
        restarted = start_server(
            workdir, "--auth-tokens", str(tokens_path), "--sweep-interval", "200ms",
            "--listen", server.address, db_url=server.db_url,
        )  # fmt: skip
        with Client(restarted.address, timeout=10, token=gateway.token) as client:
            again = f"rot-{run}-restarted"
            client.start("mail_flow", id=again, group=GROUP)
            assert client.handle(again).result(timeout=60) == "sent"
        emails = [line for line in fleet.lines() if line.startswith(f"{held} email ")]
        assert len(emails) == 1, f"the held step ran {len(emails)} times\n{fleet.logs()}"
        logs = fleet.logs()
        assert old.token not in logs and new.token not in logs
    finally:
        fleet.stop_all()
        if restarted is not None:
            restarted.stop()
        server.kill()
