"""Who a request is from (its cookies), and the CSRF check of every POST.

The token lives in an HttpOnly, SameSite=Strict cookie (no script reads it, no
other site's page sends it). Every form carries the CSRF cookie's value in a
hidden field, and a POST whose field does not match the cookie is refused
(double submit: another site can neither read the cookie nor set it).
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from troth_server.console._clients import ANONYMOUS, Identity

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import Response

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "NAME_COOKIE",
    "TOKEN_COOKIE",
    "clear_note",
    "csrf_ok",
    "csrf_token",
    "finish",
    "identity",
    "note",
    "read_note",
    "remember",
    "sign_out",
]

TOKEN_COOKIE = "troth_token"
NAME_COOKIE = "troth_name"
CSRF_COOKIE = "troth_csrf"
CSRF_FIELD = "csrf"
NOTE_COOKIE = "troth_note"
"""What the server said of a settle, for the page the settler lands on (one view)."""
_MAX_AGE = 12 * 3600


def identity(request: Request) -> Identity:
    token = request.cookies.get(TOKEN_COOKIE) or None
    name = request.cookies.get(NAME_COOKIE) or None
    return Identity(token, name) if token or name else ANONYMOUS


def csrf_token(request: Request) -> str:
    """The CSRF value for this browser: its cookie's, or a new one (set by `finish`)."""
    found = request.cookies.get(CSRF_COOKIE, "")
    if len(found) >= 32:
        return found
    made: str = request.state.__dict__.setdefault("csrf_new", secrets.token_urlsafe(32))
    return made


def finish(request: Request, response: Response, *, secure: bool) -> None:
    """Set the CSRF cookie when this request made one."""
    made = request.state.__dict__.get("csrf_new")
    if made:
        _set(response, CSRF_COOKIE, made, secure=secure)


def csrf_ok(request: Request, form: Mapping[str, str]) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = form.get(CSRF_FIELD, "")
    return len(cookie) >= 32 and hmac.compare_digest(cookie.encode(), sent.encode())


def remember(response: Response, who: Identity, *, secure: bool) -> None:
    """Sign in: keep the token (or the name) in the browser's cookies."""
    for name, value in ((TOKEN_COOKIE, who.token), (NAME_COOKIE, who.name)):
        if value:
            _set(response, name, value, secure=secure)
        else:
            response.delete_cookie(name, path="/")


def note(response: Response, text: str, *, secure: bool) -> None:
    """Keep `text` for the next page (a cookie of this site only: no other sets it)."""
    response.set_cookie(NOTE_COOKIE, quote(text[:2000]), max_age=60, path="/",
                        httponly=True, samesite="strict", secure=secure)  # fmt: skip


def read_note(request: Request) -> str:
    return unquote(request.cookies.get(NOTE_COOKIE, ""))


def clear_note(response: Response) -> None:
    response.delete_cookie(NOTE_COOKIE, path="/", httponly=True, samesite="strict")


def sign_out(response: Response) -> None:
    for name in (TOKEN_COOKIE, NAME_COOKIE):
        response.delete_cookie(name, path="/", httponly=True, samesite="strict")


def _set(response: Response, name: str, value: str, *, secure: bool) -> None:
    response.set_cookie(
        name,
        value,
        max_age=_MAX_AGE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
