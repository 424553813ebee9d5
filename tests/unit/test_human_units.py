"""Durations and sizes in words: one duration syntax for every flag (the CLI's
`--timeout` too), `troth serve --help` defaults and the limits in error messages
written as durations (`366d`) and byte sizes (`1 MiB`), never raw milliseconds."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration

from troth import Client
from troth._cli import main
from troth._cli.args import parse_duration
from troth._durations import duration_ms, format_duration
from troth.v1 import promises_pb2 as pb
from troth.v1 import types_pb2 as types
from troth_server.api import _convert as convert
from troth_server.config import _OPTIONS, Limits, Settings, build_parser, parse_duration_ms
from troth_server.domain.errors import InvalidArgument
from troth_server.units import duration_text, size_text

LIMITS = Limits()


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (250, "250ms"),
        (1500, "1s500ms"),
        (10_000, "10s"),
        (5_400_000, "1h30m"),
        (86_400_000, "1d"),
        (366 * 86_400_000, "366d"),
        (86_400_000 + 1, "1d1ms"),
    ],
)
def test_exact_durations_read_back_as_they_were(ms: int, text: str) -> None:
    assert format_duration(timedelta(milliseconds=ms), exact=True) == text == duration_text(ms)
    assert duration_ms(text) == ms


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (1, "1 byte"),
        (512, "512 bytes"),
        (1536, "1.5 KiB (1536 bytes)"),
        (65_536, "64 KiB (65536 bytes)"),
        (1_048_576, "1 MiB (1048576 bytes)"),
        (3 << 30, "3 GiB (3221225472 bytes)"),
    ],
)
def test_sizes(size: int, text: str) -> None:
    assert size_text(size) == text


def test_serve_help_prints_duration_defaults_as_durations() -> None:
    parser = build_parser()
    helps = {opt: action.help or "" for action in parser._actions for opt in action.option_strings}
    defaults = Settings()
    durations = [(flag, name) for flag, (name, kind, _) in _OPTIONS.items() if kind is None]
    assert len(durations) >= 8
    for flag, name in durations:
        value = getattr(defaults.limits if hasattr(defaults.limits, name) else defaults, name)
        shown = re.search(r"\(default: ([^)]+)\)$", helps[f"--{flag}"])
        assert shown is not None, flag
        assert duration_ms(shown.group(1)) == value, (flag, shown.group(1))
    assert helps["--default-ttl"].endswith("(default: 1d)")
    assert helps["--max-ttl"].endswith("(default: 366d)")
    assert helps["--max-payload-bytes"].endswith("(default: 1 MiB (1048576 bytes))")
    assert not re.search(r"default: \d+ms\)", parser.format_help())


def test_the_cli_timeout_takes_the_one_duration_syntax(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []

    def get(self: Client, id: str) -> object:
        seen.append(self._timeout)
        raise SystemExit(0)

    monkeypatch.setattr(Client, "get", get)
    for value in ("1h30m", "250ms", "2s"):
        with pytest.raises(SystemExit):
            main(["--server", "a:1", "--timeout", value, "promises", "get", "p"])
    assert seen == [5400.0, 0.25, 2.0]


def test_a_bare_number_of_seconds_is_refused_saying_how_to_write_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--timeout", "10", "promises", "get", "p"]) == 2
    err = capsys.readouterr().err
    assert "argument --timeout: invalid duration '10': give it a unit, e.g. 10s" in err
    with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 1\.5s"):
        parse_duration("1.5")
    # troth serve reads its flags with the same hint.
    with pytest.raises(ValueError, match=r"'90' is not a duration; give it a unit, e\.g\. 90s"):
        parse_duration_ms("90")


def _refusal(call: object) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        call()  # type: ignore[operator]
    return caught.value


def test_limits_in_error_messages_are_in_words() -> None:
    too_long = Duration(seconds=367 * 86_400)
    error = _refusal(
        lambda: convert.create_request(pb.CreatePromiseRequest(id="a", ttl=too_long), LIMITS)
    )
    assert (error.field, error.message) == ("ttl", "ttl: exceeds the limit of 366d")
    big = types.Payload(data=b"x" * (LIMITS.max_payload_bytes + 1))
    error = _refusal(lambda: convert.payload(big, LIMITS, "param"))
    assert error.message == (
        "param: is 1 MiB (1048577 bytes); the limit is 1 MiB (1048576 bytes) (data plus headers)"
    )
    error = _refusal(lambda: convert.lease_ms(Duration(seconds=3600), LIMITS))
    assert error.message == "lease: must be between 1s and 10m; omit it for the default"
