"""Why a call was refused before it ran: not authenticated, or not allowed.

Both are `DomainError`s, so `api/_status.py` maps them like every other
refusal; each carries a distinct `troth.errors.Reason`. Messages never quote a
token or a secret: at most the key id of a token-file token, which is no secret.
"""

from __future__ import annotations

from troth.errors import Reason
from troth_server.domain.errors import DomainError


class AuthError(DomainError):
    """A call refused by authentication or the RPC x role table."""


class Unauthenticated(AuthError):
    """No credentials, or credentials that prove nothing (UNAUTHENTICATED).

    `reason` is one of `CREDENTIALS_MISSING`, `CREDENTIALS_MALFORMED`,
    `TOKEN_UNKNOWN`, `TOKEN_INVALID`, `TOKEN_EXPIRED`.
    """

    reason = Reason.UNAUTHENTICATED

    def __init__(self, reason: Reason, message: str, **metadata: str) -> None:
        super().__init__(message, **metadata)
        self.reason = reason


class NotAllowed(AuthError):
    """An authenticated principal asked for what its grant does not give (PERMISSION_DENIED).

    `reason` is `ROLE_NOT_ALLOWED` (the RPC x role table) or `GROUP_NOT_ALLOWED`
    (a worker polling a group its grant does not name).
    """

    reason = Reason.PERMISSION_DENIED

    def __init__(self, reason: Reason, message: str, **metadata: str) -> None:
        super().__init__(message, **metadata)
        self.reason = reason


class AuthConfigError(Exception):
    """A token file, key file or JWKS file that cannot be used; the message says why."""
