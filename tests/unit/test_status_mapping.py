"""api/_status.py maps every server error to a status code and an ErrorInfo reason."""

from __future__ import annotations

import importlib
import pkgutil

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from troth.errors import ERROR_DOMAIN, Reason
from troth_server.api._status import STATUS_CODES, status_for
from troth_server.domain.errors import DomainError, InvalidArgument
from troth_server.store import StoreError


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_all_subclasses(sub)}
    return found


def test_every_error_class_has_a_status_code() -> None:
    import troth_server

    for module in pkgutil.walk_packages(troth_server.__path__, "troth_server."):
        if ".migrations" not in module.name:
            importlib.import_module(module.name)

    missing = {c for c in _all_subclasses(DomainError) | _all_subclasses(StoreError)}
    missing -= set(STATUS_CODES)
    assert missing == set(), f"add these to api/_status.STATUS_CODES: {missing}"


def _decode(status: grpc.Status) -> tuple[status_pb2.Status, error_details_pb2.ErrorInfo]:
    (key, raw), *_ = status.trailing_metadata
    assert key == "grpc-status-details-bin"
    decoded = status_pb2.Status.FromString(raw)
    info = error_details_pb2.ErrorInfo()
    assert decoded.details[0].Unpack(info)
    return decoded, info


@pytest.mark.parametrize("cls", sorted(STATUS_CODES, key=lambda c: c.__name__))
def test_status_carries_code_reason_and_domain(cls: type[Exception]) -> None:
    if issubclass(cls, DomainError):
        exc: Exception = DomainError.__new__(cls)
        DomainError.__init__(exc, "what went wrong; what to do", field="x")  # type: ignore[arg-type]
    else:
        exc = cls("disk on fire")
    status = status_for(exc)
    assert status.code == STATUS_CODES[cls]
    decoded, info = _decode(status)
    assert decoded.code == status.code.value[0]
    assert info.domain == ERROR_DOMAIN
    assert info.reason in set(Reason)
    assert status.code is not grpc.StatusCode.UNKNOWN


def test_unexpected_errors_are_internal_and_say_so() -> None:
    status = status_for(KeyError("boom"))
    assert status.code == grpc.StatusCode.INTERNAL
    _, info = _decode(status)
    assert info.reason == Reason.INTERNAL
    assert "boom" not in status.details


def test_a_commit_of_unknown_outcome_says_to_retry_the_same_call() -> None:
    from troth_server.store import CommitOutcomeUnknown

    status = status_for(CommitOutcomeUnknown("the connection was lost while committing"))
    assert status.code == grpc.StatusCode.UNAVAILABLE
    message = status.details
    assert "may or may not have been made" in message
    assert "retry the same call" in message
    assert "nothing was changed" not in message


@pytest.mark.parametrize("char", ["a", "%", "\u00e9", "\U0001f600"])
def test_a_long_message_fits_the_trailers_as_grpc_encodes_it(char: str) -> None:
    # grpc-message is percent-encoded: "é" x 1,000 was 2 KiB of UTF-8 but 6 KiB on the
    # wire, and with its copy in grpc-status-details-bin the trailers passed the 8 KiB
    # soft limit past which clients refuse them (RESOURCE_EXHAUSTED, at random).
    status = status_for(InvalidArgument("value", char * 100_000))
    message = status.details
    wire = sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in message.encode())
    assert 1000 <= wire <= 2048, wire
    assert message.endswith("more bytes)")
    trailers = sum(len(k) + len(v) for k, v in status.trailing_metadata)
    assert wire + trailers < 8192 - 512, (wire, trailers)
