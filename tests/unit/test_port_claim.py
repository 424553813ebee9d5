"""`claim_port`: a supervisor's claim on its listen port (real sockets and lock files)."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import TYPE_CHECKING

from troth_server.supervisor import claim_port

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pytest


def _free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])


@contextmanager
def _claimed(listen: str) -> Iterator[int]:
    """A claim of `listen`'s port that must succeed, given up at the block's end."""
    lock, refusal = claim_port(listen)
    assert refusal is None, refusal
    assert lock is not None
    try:
        yield lock
    finally:
        os.close(lock)


def test_port_zero_needs_no_claim() -> None:
    assert claim_port("127.0.0.1:0") == (None, None)


def test_a_port_is_claimed_once_until_its_lock_is_given_up() -> None:
    listen = f"127.0.0.1:{_free_port()}"
    with _claimed(listen):
        lock, refusal = claim_port(listen)
        assert lock is None
        assert refusal is not None
        assert "in use by another troth server" in refusal
        assert "--listen HOST:PORT" in refusal
    with _claimed(listen):  # given up: the next claim has it
        pass


def test_a_port_something_listens_on_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        lock, refusal = claim_port(listen)
        assert lock is None
        assert refusal is not None
        assert "the address is in use" in refusal
    with _claimed(listen):  # closed: free again (and its lock was given back)
        pass


def test_an_address_of_a_family_this_machine_lacks_is_left_to_grpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host that names an address this machine cannot make a socket for (IPv6 on a
    kernel without it: EAFNOSUPPORT) is not a port in use, nor a crash of the
    supervisor: gRPC's own bind says what is wrong."""
    port = _free_port()
    lacking = (socket.AF_UNSPEC, socket.SOCK_STREAM, 0, "", ("::1", port))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *_a, **_k: [lacking])
    with _claimed(f"localhost:{port}"):
        pass
