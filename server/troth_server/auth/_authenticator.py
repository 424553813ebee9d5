"""The sources of principals together: `authorization` metadata -> `Principal`.

`Authenticator.cached` is the hot path (no hashing beyond one SHA-256, no
signature check): a token seen and verified before. `Authenticator.verify` does
the work the first time (one scrypt, or one signature check) and is meant to
run off the event loop. `reload` re-reads every file (on SIGHUP); a file that
fails to parse keeps its old table, and the error is returned to be logged.

Every reload raises `generation`: a credential authenticated under an older
generation must be looked up again before it is trusted (`api/_door.py` does, for
every call and every open stream, within a second). Tokens verified before a
reload stay verified when their entry's secret hash did not change (no scrypt
again), with the principal the new file gives them: a narrowed grant takes effect,
a removed entry is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.auth._errors import AuthConfigError, Unauthenticated
from troth_server.auth._jwt import PERMISSIONS_CLAIM, SUPPORTED_ALGORITHMS, JwtVerifier
from troth_server.auth._tokens import TOKEN_PREFIX, TokenTable, split_token

if TYPE_CHECKING:
    from pathlib import Path

    from troth_server.domain.access import Principal

BEARER = "bearer "
_MAX_TOKEN = 8192


@dataclass(frozen=True, slots=True)
class AuthSources:
    """Where principals come from (from `troth serve` flags)."""

    tokens_file: Path | None = None
    jwt_key_file: Path | None = None
    jwt_jwks_file: Path | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_algorithms: tuple[str, ...] = SUPPORTED_ALGORITHMS
    jwt_permissions_claim: str = PERMISSIONS_CLAIM

    @property
    def configured(self) -> bool:
        return any((self.tokens_file, self.jwt_key_file, self.jwt_jwks_file))

    @property
    def uses_jwt(self) -> bool:
        return self.jwt_key_file is not None or self.jwt_jwks_file is not None


def bearer_token(header: str | None) -> str:
    """The token of `authorization: Bearer <token>`; UNAUTHENTICATED if there is none."""
    if header is None:
        raise Unauthenticated(
            Reason.CREDENTIALS_MISSING,
            "this server requires authentication and the call carried no token: give the "
            "client one (the CLI and `troth worker`: --token-file PATH or TROTH_TOKEN_FILE; "
            "Python: Client(token=...) or Client(token_file=...)); grpcurl and other gRPC "
            "clients send the metadata `authorization: Bearer <token>`. A token comes from "
            "`troth tokens new` (the server's token file), or is a JWT",
        )
    if not header[: len(BEARER)].lower() == BEARER or len(header) > _MAX_TOKEN:
        raise Unauthenticated(
            Reason.CREDENTIALS_MALFORMED,
            "the authorization metadata must be `Bearer <token>`",
        )
    token = header[len(BEARER) :].strip()
    if not token:
        raise Unauthenticated(
            Reason.CREDENTIALS_MALFORMED, "the authorization metadata has an empty token"
        )
    return token


class Authenticator:
    """The token table and the JWT verifier of one server; either may be absent."""

    def __init__(self, sources: AuthSources) -> None:
        self.sources = sources
        self._tokens: TokenTable | None = None
        self._jwt: JwtVerifier | None = None
        self.generation = 0
        """Raised by every `reload`: credentials looked up before must be looked up again."""
        errors = self.reload()
        if errors:
            raise AuthConfigError("; ".join(errors))

    def reload(self) -> list[str]:
        """Re-read every configured file; a file that fails keeps its old table.
        Returns the errors (empty when everything loaded). Caches start empty."""
        errors: list[str] = []
        sources = self.sources
        self.generation += 1
        if sources.tokens_file is not None:
            try:
                tokens = TokenTable.load(sources.tokens_file)
                if self._tokens is not None:
                    tokens.keep_verified(self._tokens)
                self._tokens = tokens
            except AuthConfigError as exc:
                errors.append(str(exc))
        if sources.uses_jwt:
            try:
                self._jwt = JwtVerifier.load(
                    key_file=sources.jwt_key_file,
                    jwks_file=sources.jwt_jwks_file,
                    issuer=sources.jwt_issuer,
                    audience=sources.jwt_audience,
                    algorithms=sources.jwt_algorithms,
                    permissions_claim=sources.jwt_permissions_claim,
                )
            except AuthConfigError as exc:
                errors.append(str(exc))
        return errors

    @property
    def token_count(self) -> int:
        return len(self._tokens) if self._tokens is not None else 0

    def cached(self, token: str) -> Principal | None:
        """The principal of a token verified before; None when it must be `verify`-ed.
        Raises `Unauthenticated` for a token no source could accept."""
        if token.startswith(TOKEN_PREFIX):
            key_id, _secret = split_token(token)
            return self._token_table().cached(key_id, token)
        return self._verifier(token).cached(token)

    def expires_at(self, token: str) -> float | None:
        """When a token verified before stops being accepted (epoch seconds, with the
        leeway): a JWT's `exp`; None for a token-file token, which lasts until revoked."""
        if token.startswith(TOKEN_PREFIX) or self._jwt is None:
            return None
        return self._jwt.expires_at(token)

    def verify_cheaply(self, token: str) -> Principal | None:
        """A JWT verified here and now (one signature check: microseconds, fine on the
        event loop); None for a token-file token, whose check is a scrypt (`verify`,
        off the loop)."""
        if token.startswith(TOKEN_PREFIX):
            return None
        return self._verifier(token).verify(token)

    def verify(self, token: str) -> Principal:
        """Verify a token (one scrypt or one signature check); blocking."""
        if token.startswith(TOKEN_PREFIX):
            key_id, secret = split_token(token)
            return self._token_table().verify(key_id, secret, token)
        return self._verifier(token).verify(token)

    def _token_table(self) -> TokenTable:
        if self._tokens is None:
            raise Unauthenticated(
                Reason.TOKEN_UNKNOWN,
                "this server has no token file (--auth-tokens), so it knows no troth_ token",
            )
        return self._tokens

    def _verifier(self, token: str) -> JwtVerifier:
        if token.count(".") != 2:
            raise Unauthenticated(
                Reason.CREDENTIALS_MALFORMED,
                "the bearer token is neither a troth token (troth_<key id>_<secret>) nor a JWT",
            )
        if self._jwt is None:
            raise Unauthenticated(
                Reason.TOKEN_UNKNOWN,
                "this server accepts no JWTs (no --jwt-key-file or --jwt-jwks-file)",
            )
        return self._jwt
