"""Which refusals of a worker's task stream stop it (`troth._poll_health`): those the
same credential will meet however long it retries, and not a renewable source's token
refused once the worker has run (expired, revoked: the source may give another; issue
26's rotation goes on)."""

from __future__ import annotations

import grpc
import pytest

from troth._poll_health import refusal_line, refused_for_good
from troth.errors import PermissionDeniedError, Reason, UnauthenticatedError, UnavailableError

UNAUTH = grpc.StatusCode.UNAUTHENTICATED


def _refused(reason: Reason) -> UnauthenticatedError:
    return UnauthenticatedError(UNAUTH, reason.value, f"refused: {reason.value}")


@pytest.mark.parametrize(
    ("reason", "renewable", "connected", "stops"),
    [
        # No credential at all: nothing will ever send one.
        (Reason.CREDENTIALS_MISSING, False, False, True),
        (Reason.CREDENTIALS_MISSING, False, True, True),
        # A fixed token: refused once, refused for good, whatever the reason.
        (Reason.TOKEN_UNKNOWN, False, False, True),
        (Reason.TOKEN_UNKNOWN, False, True, True),
        (Reason.TOKEN_EXPIRED, False, True, True),
        (Reason.TOKEN_INVALID, False, False, True),
        # A source that may give another token: a set-up mistake before it ever
        # connected stops it...
        (Reason.TOKEN_UNKNOWN, True, False, True),
        (Reason.TOKEN_INVALID, True, False, True),
        (Reason.CREDENTIALS_MALFORMED, True, False, True),
        # ...but an expiry, or a revocation once it ran, waits for the source's next token.
        (Reason.TOKEN_EXPIRED, True, False, False),
        (Reason.TOKEN_EXPIRED, True, True, False),
        (Reason.TOKEN_UNKNOWN, True, True, False),
        (Reason.TOKEN_INVALID, True, True, False),
    ],
)
def test_which_refusals_stop_the_worker(
    reason: Reason, renewable: bool, connected: bool, stops: bool
) -> None:
    error = _refused(reason)
    assert refused_for_good(error, renewable=renewable, connected=connected) is stops


def test_other_failures_never_stop_it() -> None:
    for error in (
        UnavailableError(grpc.StatusCode.UNAVAILABLE, "", "the server is away"),
        PermissionDeniedError(grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED", "no"),
    ):
        assert not refused_for_good(error, renewable=False, connected=False)


def test_the_line_says_what_was_wrong_and_what_to_do() -> None:
    missing = refusal_line("w-1", _refused(Reason.CREDENTIALS_MISSING), None)
    assert missing.startswith("worker w-1 stops: the server requires authentication and this ")
    unknown = refusal_line("w-1", _refused(Reason.TOKEN_UNKNOWN), "token_file 'tok'")
    assert "refused the token from token_file 'tok' (TOKEN_UNKNOWN: refused: TOKEN_UNKNOWN)" in (
        unknown
    )
    for line in (missing, unknown):
        for what_to_do in ("--token-file PATH", "TROTH_TOKEN_FILE", "Client(token=...)"):
            assert what_to_do in line
