"""JsonCodec and Payload: what the default codec writes and how leniently it reads."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from troth import Codec, JsonCodec, Payload

JSON_HEADERS = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -7, 1.5, "", "héllo ✓", [1, "a", None], {"a": {"b": [1, 2]}, "c": False}],
)
def test_round_trip(value: Any) -> None:
    codec = JsonCodec()
    assert codec.decode(codec.encode(value)) == value


def test_encode_is_compact_utf8_json_with_content_type() -> None:
    payload = JsonCodec().encode({"a": [1, 2], "b": "é"})
    assert payload.data == '{"a":[1,2],"b":"é"}'.encode()
    assert payload.headers == JSON_HEADERS


def test_empty_payload_decodes_to_none() -> None:
    assert JsonCodec().decode(Payload()) is None
    assert JsonCodec().decode(Payload(headers=JSON_HEADERS, data=b"")) is None


@pytest.mark.parametrize(
    "headers",
    [{}, {"content-type": "application/octet-stream"}, {"content-type": "text/plain"}],
)
def test_non_json_payload_decodes_to_raw_bytes(headers: dict[str, str]) -> None:
    assert JsonCodec().decode(Payload(headers=headers, data=b"\x00\x01")) == b"\x00\x01"


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        "application/cloudevents+json",
    ],
)
def test_json_content_types_are_recognised(content_type: str) -> None:
    payload = Payload(headers={"Content-Type": content_type}, data=b'{"x":1}')
    assert payload.is_json
    assert JsonCodec().decode(payload) == {"x": 1}


def test_invalid_json_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"not valid JSON.*payload\.data"):
        JsonCodec().decode(Payload(headers=JSON_HEADERS, data=b"{nope"))


def test_unencodable_value_names_type_and_fix() -> None:
    with pytest.raises(TypeError, match=r"cannot encode 'set'.*codec"):
        JsonCodec().encode({1, 2})


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        JsonCodec().encode({"x": math.nan})


def test_payload_is_frozen_and_copies_headers() -> None:
    headers = {"content-type": "application/json"}
    payload = Payload(headers=headers, data=b"1")
    headers["content-type"] = "text/plain"
    assert payload.content_type == "application/json"
    with pytest.raises(dataclasses.FrozenInstanceError):
        payload.data = b"2"  # type: ignore[misc]


def test_payload_properties() -> None:
    assert Payload().is_empty
    assert not Payload(headers=JSON_HEADERS).is_empty
    assert Payload().content_type is None
    assert not Payload(data=b"1").is_json


def test_json_codec_satisfies_the_protocol() -> None:
    assert isinstance(JsonCodec(), Codec)
