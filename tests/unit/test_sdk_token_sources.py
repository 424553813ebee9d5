"""Token sources without a server (issue 26): `Client(token=callable)` and
`Client(token_file=...)` / `TROTH_TOKEN_FILE` give the token each call sends, asked at
most once per `TOKEN_CHECK_S` and at once on `refresh()`; a source that cannot give
a token is a `ConfigurationError` at construction and, later, keeps the last good
token with a warning; a supplied token never goes in plaintext off this machine and
never shows in a repr, a log line or a message. (Renewal on the wire:
test_sdk_token_renewal.py, tests/api/test_sdk_credentials_api.py.)"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from troth import Client, ConfigurationError
from troth._credentials import AUTHORIZATION_METADATA_KEY, TOKEN_CHECK_S, token_source
from troth._transport import Transport

if TYPE_CHECKING:
    from troth._credentials import TokenSource

OLD = "tok-old-8c1f2a9e5d"
NEW = "tok-new-47b0e3c6aa"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _bearer(transport: Transport) -> str:
    return dict(transport.metadata)[AUTHORIZATION_METADATA_KEY]


def _source(token: object = None, token_file: object = None, **environ: str) -> TokenSource:
    source = token_source(token, token_file, environ, clock=CLOCK)  # type: ignore[arg-type]
    assert source is not None
    return source


CLOCK = Clock()


def _replace(path: Path, text: str) -> None:
    """Write the file whole, then rename it into place (as a secret volume does)."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_a_callable_is_asked_at_most_once_per_interval_and_at_once_on_refresh() -> None:
    current, asked = [OLD], []

    def supplier() -> str:
        asked.append(current[0])
        return current[0]

    transport = Transport("127.0.0.1:1", token=_source(supplier))
    try:
        assert len(asked) == 1  # read (and checked) at construction
        first = transport.metadata
        assert _bearer(transport) == f"Bearer {OLD}"
        current[0] = NEW
        for _ in range(100):
            assert transport.metadata is first  # the same tuple: no new metadata per call
        assert len(asked) == 1
        CLOCK.now += TOKEN_CHECK_S
        assert _bearer(transport) == f"Bearer {NEW}"
        assert len(asked) == 2
        second = transport.metadata
        assert second is not first and transport.metadata is second
        current[0] = OLD
        source = transport._token
        assert source is not None
        assert source.refresh()[1] == f"Bearer {OLD}"  # at once, whatever the interval
        assert _bearer(transport) == f"Bearer {OLD}"
    finally:
        transport.close()


def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {OLD}\n")
    transport = Transport("127.0.0.1:1", token=_source(token_file=path))
    try:
        assert _bearer(transport) == f"Bearer {OLD}"  # whitespace stripped
        _replace(path, f"{NEW}\n")
        assert _bearer(transport) == f"Bearer {OLD}"  # not looked at again yet
        CLOCK.now += TOKEN_CHECK_S
        assert _bearer(transport) == f"Bearer {NEW}"
    finally:
        transport.close()


def test_troth_token_file_is_read_and_arguments_win(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(NEW)
    assert _source(TROTH_TOKEN_FILE=str(path), TROTH_TOKEN=OLD).pair[1] == f"Bearer {NEW}"
    assert _source(OLD, TROTH_TOKEN_FILE=str(path)).pair[1] == f"Bearer {OLD}"
    assert _source(lambda: OLD, TROTH_TOKEN_FILE=str(path)).pair[1] == f"Bearer {OLD}"
    with pytest.raises(ConfigurationError, match="token and token_file are both given"):
        token_source(OLD, path, {})


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, r"token_file '.*token': no such file"),
        ("\n  \n", r"token_file '.*token': is empty"),
        (f"Bearer {OLD}", "starts with 'Bearer '"),
        (f"{OLD} {NEW}", "spaces, line breaks or non-ASCII"),
    ],
)
def test_an_unusable_token_file_is_refused_at_construction_naming_it(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigurationError, match=says) as caught:
        Client("127.0.0.1:1", token_file=path)
    assert OLD not in str(caught.value) and NEW not in str(caught.value)


def test_a_troth_token_file_that_is_missing_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TROTH_TOKEN_FILE", str(tmp_path / "nothing"))
    with pytest.raises(ConfigurationError, match=r"TROTH_TOKEN_FILE '.*nothing': no such file"):
        Client("127.0.0.1:1")


@pytest.mark.parametrize(
    ("supplier", "says"),
    [
        (lambda: "", "token supplier .* is empty"),
        (lambda: None, r"token supplier .* must be a string \(got NoneType\)"),
        (lambda: f"{OLD}\n", "spaces, line breaks"),
        (lambda: {}["missing"], "token supplier .*: raised KeyError"),
    ],
)
def test_a_callable_that_gives_no_usable_token_is_refused_at_construction(
    supplier: object, says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        Client("127.0.0.1:1", token=supplier)  # type: ignore[arg-type]
    assert OLD not in str(caught.value)


def test_a_source_that_fails_later_keeps_the_last_token_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="troth")
    path = tmp_path / "token"
    path.write_text(OLD)
    transport = Transport("127.0.0.1:1", token=_source(token_file=path))
    try:
        path.unlink()
        for _ in range(3):
            CLOCK.now += TOKEN_CHECK_S
            assert _bearer(transport) == f"Bearer {OLD}"
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, caplog.text
        assert "no such file; still sending the last token" in warnings[0].getMessage()
        path.write_text(f"{OLD} torn")  # (a write caught halfway: not one word)
        CLOCK.now += TOKEN_CHECK_S
        assert _bearer(transport) == f"Bearer {OLD}"
        path.write_text(NEW)
        CLOCK.now += TOKEN_CHECK_S
        assert _bearer(transport) == f"Bearer {NEW}"
        assert "gave a new token" in caplog.text
    finally:
        transport.close()
    assert OLD not in caplog.text and NEW not in caplog.text


def test_a_callable_that_fails_later_keeps_the_last_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="troth")
    answers: list[object] = [OLD]

    def supplier() -> str:
        answer = answers[-1]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    transport = Transport("127.0.0.1:1", token=_source(supplier))
    try:
        answers.append(TimeoutError("the identity provider did not answer"))
        CLOCK.now += TOKEN_CHECK_S
        assert _bearer(transport) == f"Bearer {OLD}"
        assert "raised TimeoutError: the identity provider did not answer" in caplog.text
        answers.append(42)
        CLOCK.now += TOKEN_CHECK_S
        assert _bearer(transport) == f"Bearer {OLD}"
        assert "must be a string (got int)" in caplog.text
    finally:
        transport.close()
    assert OLD not in caplog.text


@pytest.mark.parametrize("kind", ["callable", "file"])
def test_a_supplied_token_in_plaintext_off_this_machine_is_refused(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "token"
    path.write_text(OLD)
    given = {"token": lambda: OLD} if kind == "callable" else {"token_file": path}
    with pytest.raises(ConfigurationError, match="refusing to send a bearer token in plaintext"):
        Client("10.0.0.1:7070", **given)  # type: ignore[arg-type]
    Client("10.0.0.1:7070", allow_plaintext_token=True, **given).close()  # type: ignore[arg-type]
    Client("127.0.0.1:7070", **given).close()  # type: ignore[arg-type]


def test_no_repr_shows_a_supplied_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(OLD)
    for client in (
        Client("127.0.0.1:1", token=lambda: NEW),
        Client("127.0.0.1:1", token_file=path),
    ):
        with client:
            transport = client._transport
            shown = repr(client) + repr(vars(client)) + repr(vars(transport))
            shown += repr(transport.metadata) + repr(transport._token)
            assert OLD not in shown and NEW not in shown
            assert "<redacted>" in repr(transport.metadata)
