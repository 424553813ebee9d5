"""The sources of principals: a token file of hashed secrets, and signed JWTs.

Pure of gRPC and of the store: `troth_server.api._auth` (the interceptor) asks
an `Authenticator` who a bearer token is, then `troth_server.domain.access`
what that principal may call. A credential not seen before is verified on the
`VerifierPool`, a small bounded pool of threads of its own.
"""

from __future__ import annotations

from troth_server.auth._authenticator import Authenticator, AuthSources, bearer_token
from troth_server.auth._errors import AuthConfigError, AuthError, NotAllowed, Unauthenticated
from troth_server.auth._jwt import (
    GROUPS_CLAIM,
    LEEWAY_S,
    PERMISSIONS_CLAIM,
    PREFIXES_CLAIM,
    ROLES_CLAIM,
    SUPPORTED_ALGORITHMS,
    parse_algorithms,
    permissions_claim_problem,
)
from troth_server.auth._tokens import Minted, hash_secret, mint
from troth_server.auth._verifier_pool import VerificationsBusy, VerifierPool

__all__ = [
    "GROUPS_CLAIM",
    "LEEWAY_S",
    "PERMISSIONS_CLAIM",
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
    "VerificationsBusy",
    "VerifierPool",
    "bearer_token",
    "hash_secret",
    "mint",
    "parse_algorithms",
    "permissions_claim_problem",
]
