"""The sources of principals: a token file of hashed secrets, and signed JWTs.

Pure of gRPC and of the store: `troth_server.api._auth` (the interceptor) asks
an `Authenticator` who a bearer token is, then `troth_server.domain.access`
what that principal may call.
"""

from __future__ import annotations

from troth_server.auth._authenticator import Authenticator, AuthSources, bearer_token
from troth_server.auth._errors import AuthConfigError, AuthError, NotAllowed, Unauthenticated
from troth_server.auth._jwt import (
    GROUPS_CLAIM,
    LEEWAY_S,
    PREFIXES_CLAIM,
    ROLES_CLAIM,
    SUPPORTED_ALGORITHMS,
    parse_algorithms,
)
from troth_server.auth._tokens import Minted, hash_secret, mint

__all__ = [
    "GROUPS_CLAIM",
    "LEEWAY_S",
    "PREFIXES_CLAIM",
    "ROLES_CLAIM",
    "SUPPORTED_ALGORITHMS",
    "AuthConfigError",
    "AuthError",
    "AuthSources",
    "Authenticator",
    "Minted",
    "NotAllowed",
    "Unauthenticated",
    "bearer_token",
    "hash_secret",
    "mint",
    "parse_algorithms",
]
