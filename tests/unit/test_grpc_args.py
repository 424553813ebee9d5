"""Every gRPC option key troth passes is one gRPC knows (issue 27: a misspelt key,
`grpc.http2.min_recv_ping_interval_without_data_ms`, passed silently and cut idle
streams off every five minutes), and the keepalive of both ends agrees.

Known keys: `tests/fixtures/grpc_channel_args.txt` (gRPC's own list, its source noted
there), and the installed grpcio's core library, which holds each key it reads as a
C string."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from grpc._cython import cygrpc

from troth import _grpc_args
from troth._credentials import TlsConfig
from troth._transport import channel_options
from troth_server.api._admission import backlog_options
from troth_server.app import grpc_options
from troth_server.config import Settings, settings_from

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "grpc_channel_args.txt"
SCANNED = ("sdk", "server", "bench", "tests", "examples")
"""Where option lists are written: all the Python of the repository but generated code."""

_KEY = re.compile(r"grpc\.[A-Za-z0-9_.]+")
_SERVICE = re.compile(r"grpc\.[a-z_.]+\.v\d+(alpha)?\.[A-Z]\w*")
"""A gRPC service's full name (`grpc.health.v1.Health`): not an option key."""


def known() -> dict[str, str]:
    """gRPC's names: C macro -> key."""
    names: dict[str, str] = {}
    for line in FIXTURE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            macro, key = line.split()
            names[macro] = key
    return names


KNOWN_KEYS = frozenset(known().values())
_CORE = Path(cygrpc.__file__).read_bytes()


def in_installed_grpcio(key: str) -> bool:
    """Whether the installed grpcio's core library holds `key` as a C string."""
    return key.encode() + b"\0" in _CORE


def repository_python() -> list[Path]:
    """The repository's Python as git tracks it (not what lies ignored beside it: a
    virtualenv, the peers benchmark's installs in bench/.cache, thousands of files),
    generated code (`sdk/troth/v1`) and this file (which names the misspelt key on
    purpose) left out."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SCANNED],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    return [
        path
        for name in sorted(listed)
        if name.endswith(".py")
        and (path := ROOT / name).is_file()
        and "v1" not in path.relative_to(ROOT).parts[:3]
        and path != Path(__file__).resolve()
    ]


def written_keys(paths: list[Path]) -> dict[str, list[str]]:
    """Every string constant in `paths` that looks like a gRPC option key: key -> where."""
    found: dict[str, list[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _KEY.fullmatch(node.value)
                and not _SERVICE.fullmatch(node.value)
            ):
                found.setdefault(node.value, []).append(f"{path.name}:{node.lineno}")
    return found


def built_options() -> dict[str, list[tuple[str, Any]]]:
    """The option lists troth builds, as it builds them."""
    tls = TlsConfig(server_name="troth.internal")
    return {
        "server grpc_options": grpc_options(Settings()),
        "server backlog_options": backlog_options(1000, 1000),
        "SDK channel_options": list(channel_options()),
        "SDK TLS channel_options": list(tls.channel_options()),
    }


def test_the_fixture_is_gRPCs_list() -> None:
    names = known()
    assert len(names) > 90
    assert names["GRPC_ARG_KEEPALIVE_TIME_MS"] == "grpc.keepalive_time_ms"
    # The name that fooled us: RECV in the macro, not in the key.
    assert (
        names["GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS"]
        == "grpc.http2.min_ping_interval_without_data_ms"
    )
    assert "grpc.http2.min_recv_ping_interval_without_data_ms" not in KNOWN_KEYS
    # Transcribed right: nearly all are in the installed library too (the rest are
    # deprecated or for other platforms: Cronet, Objective-C).
    absent = sorted(key for key in KNOWN_KEYS if not in_installed_grpcio(key))
    assert len(absent) <= 10, absent


def test_each_constant_is_named_and_spelt_as_gRPC_names_it() -> None:
    names = known()
    constants = {
        name: value
        for name, value in vars(_grpc_args).items()
        if name.startswith(("ARG_", "SSL_")) and isinstance(value, str)
    }
    assert len(constants) >= 14
    for name, value in constants.items():
        macro = f"GRPC_{name}"
        assert macro in names, f"{name}: gRPC has no {macro}"
        assert value == names[macro], f"{name} = {value!r}, but gRPC's {macro} is {names[macro]!r}"
        assert in_installed_grpcio(value), f"{value!r} is not in the installed grpcio"


def test_every_option_list_troth_builds_has_only_keys_gRPC_knows() -> None:
    for what, options in built_options().items():
        for key, _value in options:
            assert key in KNOWN_KEYS, f"{what}: {key!r} is not a gRPC channel argument"
            assert in_installed_grpcio(key), f"{what}: the installed grpcio lacks {key!r}"


def test_every_grpc_key_written_anywhere_is_one_gRPC_knows() -> None:
    """A key written as a literal (an option list in a benchmark, a test, the console)
    is checked as well as the constants: a typo cannot pass silently again."""
    found = written_keys(repository_python())
    assert found, "the scan found no gRPC key at all: is it looking in the right place?"
    unknown = {key: where for key, where in found.items() if key not in KNOWN_KEYS}
    assert not unknown, f"not gRPC channel arguments: {unknown}"
    missing = {key: where for key, where in found.items() if not in_installed_grpcio(key)}
    assert not missing, f"not in the installed grpcio: {missing}"


def test_the_scan_catches_the_misspelt_key_and_skips_service_names(tmp_path: Path) -> None:
    old = tmp_path / "app.py"
    old.write_text(
        "OPTIONS = [\n"
        '    ("grpc.keepalive_time_ms", 60_000),\n'
        '    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),\n'
        "]\n"
        'SERVED = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")\n'
    )
    found = written_keys([old])
    assert set(found) == {
        "grpc.keepalive_time_ms",
        "grpc.http2.min_recv_ping_interval_without_data_ms",
    }
    assert [key for key in found if key not in KNOWN_KEYS] == [
        "grpc.http2.min_recv_ping_interval_without_data_ms"
    ]
    assert not in_installed_grpcio("grpc.http2.min_recv_ping_interval_without_data_ms")


# -- the keepalive both ends agree on ---------------------------------------------------


def test_the_server_permits_the_SDKs_pings_by_default() -> None:
    server = dict(grpc_options(Settings()))
    client = dict(channel_options())
    permitted = server[_grpc_args.ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS]
    interval = client[_grpc_args.ARG_KEEPALIVE_TIME_MS]
    assert interval == _grpc_args.PING_INTERVAL_MS
    assert permitted == _grpc_args.PERMITTED_PING_INTERVAL_MS
    # Room for a busy machine's timers: pings land well outside the strike window.
    assert permitted * 2 <= interval
    # The SDK keeps pinging on a stream that sends no data (a watch, an idle worker).
    assert client[_grpc_args.ARG_HTTP2_MAX_PINGS_WITHOUT_DATA] == 0


def test_the_strike_window_is_a_setting_checked_against_the_SDKs_interval() -> None:
    settings = settings_from(["--keepalive-min-ping-interval", "500ms"], environ={})
    assert settings.keepalive_min_ping_interval_ms == 500
    options = dict(grpc_options(settings))
    assert options[_grpc_args.ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS] == 500
    from_env = settings_from([], environ={"TROTH_KEEPALIVE_MIN_PING_INTERVAL": "30s"})
    assert from_env.keepalive_min_ping_interval_ms == 30_000
    assert settings_from(["--keepalive-min-ping-interval", "0"], environ={})
    with pytest.raises(SystemExit):
        settings_from(["--keepalive-min-ping-interval", "5m"], environ={})


def test_a_window_past_the_SDKs_interval_is_refused_saying_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        settings_from(["--keepalive-min-ping-interval", "2m"], environ={})
    err = capsys.readouterr().err
    assert "--keepalive-min-ping-interval 2m is longer than troth's SDK waits" in err
    assert "too_many_pings" in err
    assert "use at most 30s" in err
