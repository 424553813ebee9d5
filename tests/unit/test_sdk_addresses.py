"""Server addresses: one or several, parsed, checked, and turned into one gRPC target.

No server: connecting is lazy, and host names go through a fake resolver.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import pytest

from troth import Client, ConfigurationError
from troth._addresses import channel_target, parse_addresses, split_host_port
from troth._cli import main
from troth._transport import Transport, map_rpc_errors
from troth.errors import UnavailableError


def fake_dns(table: dict[str, list[str]]) -> Callable[[str, int], Sequence[str]]:
    def resolve(host: str, port: int) -> Sequence[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve


# -- parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:7070", ("127.0.0.1:7070",)),
        ("10.0.0.1:1,10.0.0.2:2", ("10.0.0.1:1", "10.0.0.2:2")),
        ("10.0.0.1:1, 10.0.0.2:2 ,db:3", ("10.0.0.1:1", "10.0.0.2:2", "db:3")),
        (["10.0.0.1:1", "10.0.0.2:2"], ("10.0.0.1:1", "10.0.0.2:2")),
        (("a:1", "[::1]:2"), ("a:1", "[::1]:2")),
        (["localhost:7070"], ("localhost:7070",)),
        # One address stays any gRPC target, commas included.
        ("ipv4:10.0.0.1:1,10.0.0.2:2", ("ipv4:10.0.0.1:1,10.0.0.2:2",)),
        ("dns:///troth.internal:7070", ("dns:///troth.internal:7070",)),
        ("unix:/run/troth.sock", ("unix:/run/troth.sock",)),
        # A missing port is troth's 7070, never gRPC's 443.
        ("127.0.0.1", ("127.0.0.1:7070",)),
        ("troth.internal", ("troth.internal:7070",)),
        ("[::1]", ("[::1]:7070",)),
        (["db"], ("db:7070",)),
        ("a:1,b", ("a:1", "b:7070")),
        (["10.0.0.1", "[::2]"], ("10.0.0.1:7070", "[::2]:7070")),
    ],
)
def test_addresses_are_parsed(given: str | list[str], expected: tuple[str, ...]) -> None:
    assert parse_addresses(given) == expected


@pytest.mark.parametrize(
    ("given", "named", "says"),
    [
        ("", "''", "empty"),
        (" 127.0.0.1:7070", "' 127.0.0.1:7070'", "surrounding spaces"),
        ("a:1,,b:2", "entry 2 of 'a:1,,b:2'", "empty"),
        ("a:1,", "entry 2 of 'a:1,'", "empty"),
        ([], "no server address", "host:port"),
        (["a:1", ""], "entry 2 of", "empty"),
        (["a:1", " b:2"], "' b:2'", "surrounding spaces"),
        (["a:1", 7070], "7070", "not a string"),
        ("a:1,b:", "'b:'", "port from 1 to 65535"),
        ("a:1,:2", "':2'", "not host:port"),
        ("a:1,b:0", "'b:0'", "port from 1 to 65535"),
        ("a:1,b:65536", "'b:65536'", "port from 1 to 65535"),
        ("a:1,b:http", "'b:http'", "port from 1 to 65535"),
        ("a:1,::1:2", "'::1:2'", "brackets, e.g. '[::1]:7070'"),
        ("a:1,[::1:2", "'[::1:2'", "[ipv6]:port"),
        ("a:1,dns:///b:2", "'dns:///b:2'", "scheme"),
        ("a:1,a:1", "'a:1' is listed twice", "once"),
        (7070, "7070", "string or a list"),
        (b"a:1,b:2", "b'a:1,b:2'", "string or a list"),
    ],
)
def test_bad_addresses_are_named(given: Any, named: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_addresses(given)
    assert named in str(caught.value)
    assert says in str(caught.value)


def test_split_host_port() -> None:
    assert split_host_port("db.internal:7070") == ("db.internal", 7070)
    assert split_host_port("[fd00::1]:7071") == ("fd00::1", 7071)
    assert split_host_port("10.0.0.1:1") == ("10.0.0.1", 1)


# -- the channel target ----------------------------------------------------------


def test_one_address_is_its_own_target() -> None:
    assert channel_target(("db.internal:7070",), resolve=fake_dns({})) == "db.internal:7070"


def test_several_ipv4_addresses_make_a_static_ipv4_target() -> None:
    target = channel_target(("10.0.0.1:7070", "10.0.0.2:7071"), resolve=fake_dns({}))
    assert target == "ipv4:10.0.0.1:7070,10.0.0.2:7071"


def test_host_names_are_resolved_once_in_order_without_repeats() -> None:
    dns = fake_dns({"a": ["10.0.0.1", "10.0.0.2"], "b": ["10.0.0.2", "10.0.0.3"]})
    target = channel_target(("a:7070", "b:7070", "10.0.0.1:7071"), resolve=dns)
    assert target == "ipv4:10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070,10.0.0.1:7071"


def test_any_ipv6_address_makes_an_ipv6_target_with_ipv4_mapped() -> None:
    dns = fake_dns({"a": ["fd00::1", "10.0.0.1"]})
    target = channel_target(("a:7070", "[fd00::2]:7071", "10.0.0.3:7072"), resolve=dns)
    assert target == (
        "ipv6:[fd00::1]:7070,[::ffff:10.0.0.1]:7070,[fd00::2]:7071,[::ffff:10.0.0.3]:7072"
    )


def test_a_host_that_does_not_resolve_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot resolve .*'nowhere\.invalid:1'"):
        channel_target(("10.0.0.1:1", "nowhere.invalid:1"), resolve=fake_dns({}))


def test_a_host_that_resolves_to_nothing_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"'empty:1' resolves to no address"):
        channel_target(("10.0.0.1:1", "empty:1"), resolve=fake_dns({"empty": []}))


def test_localhost_resolves_with_the_real_resolver() -> None:
    target = channel_target(("localhost:7070", "127.0.0.1:7071"))
    assert target.startswith(("ipv4:", "ipv6:"))
    assert "127.0.0.1]:7070" in target or "127.0.0.1:7070" in target


# -- Client, Transport, CLI ---------------------------------------------------------


def test_client_takes_a_list_or_a_comma_separated_string() -> None:
    with Client(["127.0.0.1:1", "127.0.0.1:2"]) as listed:
        assert listed.address == "127.0.0.1:1,127.0.0.1:2"
        assert repr(listed) == "Client('127.0.0.1:1,127.0.0.1:2')"
    with Client("127.0.0.1:1, 127.0.0.1:2") as joined:
        assert joined.address == "127.0.0.1:1,127.0.0.1:2"
    with Client("127.0.0.1:1") as one:
        assert one.address == "127.0.0.1:1"


def test_client_refuses_a_bad_entry_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"'127\.0\.0\.1:x' needs a host and a port"):
        Client("127.0.0.1:1,127.0.0.1:x")


def test_transport_keeps_the_addresses() -> None:
    transport = Transport(["10.0.0.1:1", "db:2"], resolve=fake_dns({"db": ["10.0.0.2"]}))
    try:
        assert transport.addresses == ("10.0.0.1:1", "db:2")
        assert transport.address == "10.0.0.1:1,db:2"
    finally:
        transport.close()


class Unreachable(grpc.RpcError, grpc.Call):
    """What grpc raises when no replica answers."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses"

    def initial_metadata(self) -> tuple[tuple[str, Any], ...]:
        return ()

    # The grpc stubs give RpcError and Call different trailing_metadata types.
    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:  # type: ignore[override]
        return ()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0


def test_unreachable_replicas_are_all_named() -> None:
    with pytest.raises(UnavailableError) as caught, map_rpc_errors("a:1,b:2"):
        raise Unreachable()
    assert "cannot reach the troth server at any of a:1,b:2" in str(caught.value)
    assert "failed to connect to all addresses" in str(caught.value)


def test_cli_takes_several_addresses_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TROTH_SERVER", "127.0.0.1:1,127.0.0.1:x")
    assert main(["promises", "get", "p"]) == 1
    assert "'127.0.0.1:x' needs a host and a port" in capsys.readouterr().err
