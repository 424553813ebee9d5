"""Search page tokens: where the next page starts, bound to the query that issued it.

Pure: no store, no clock. A token names the last row of its page by the keys
the query's order sorts on (`seq` alone for the creation orders; expire_time
and `seq` for EXPIRE_TIME_ASC), so a page starts right after it whatever was
created or settled in between, and it carries a fingerprint of the query so
that it is refused with any other query.

Tokens of the default order (CREATED_ASC, no created_before) keep the format
and fingerprint they had before orders existed, so tokens issued by an older
replica still work during a rolling upgrade.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troth_server.domain.errors import InvalidPageToken
from troth_server.store import PromiseOrder

if TYPE_CHECKING:
    from collections.abc import Mapping

    from troth_server.domain.promise import PromiseState


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last row of a page: its `seq` (0: nothing yet, start at the top) and,
    for EXPIRE_TIME_ASC, its expire_time (None: it never expires)."""

    seq: int = 0
    expire_time: int | None = None


START = Cursor()


def fingerprint(
    id_glob: str,
    states: frozenset[PromiseState],
    tags: Mapping[str, str],
    order: PromiseOrder = PromiseOrder.CREATED_ASC,
    created_before: int | None = None,
) -> str:
    """A short digest of everything in a search request but its page size and token."""
    parts: list[Any] = [id_glob, sorted(states), sorted(tags.items())]
    if order is not PromiseOrder.CREATED_ASC or created_before is not None:
        parts += [order.value, created_before]
    canonical = json.dumps(parts)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encode(cursor: Cursor, order: PromiseOrder, query: str) -> str:
    """The page token for the page after `cursor` of the query fingerprinted `query`."""
    fields: dict[str, Any] = {"after": cursor.seq, "query": query}
    if order is not PromiseOrder.CREATED_ASC:
        fields["order"] = order.value
    if order is PromiseOrder.EXPIRE_TIME_ASC:
        fields["expire"] = cursor.expire_time
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(token: str, order: PromiseOrder, query: str) -> Cursor:
    """The cursor in `token`, which must come from a search with this order and query.

    Raises:
        InvalidPageToken: The token is malformed, or was issued for another search.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        fields = json.loads(raw)
        after, issued_for = fields["after"], fields["query"]
        issued_order = fields.get("order", PromiseOrder.CREATED_ASC.value)
        expire = fields.get("expire")
    except (binascii.Error, ValueError, KeyError, TypeError, AttributeError):
        raise InvalidPageToken(
            "is not a token this server issued; pass next_page_token from a previous response"
        ) from None
    if issued_order != order.value:
        raise InvalidPageToken(
            f"was issued for a search in order {issued_order}, but this request asks for "
            f"{order.value}; keep the order of the request that returned it, or start over "
            "without a page_token"
        )
    if issued_for != query:
        raise InvalidPageToken(
            "belongs to a different search; repeat the id, states, tags, order and "
            "created_before of the request that returned it, or start over without a page_token"
        )
    if not _is_int(after) or after <= 0 or not (expire is None or _is_int(expire)):
        raise InvalidPageToken(
            "is not a token this server issued; pass next_page_token from a previous response"
        )
    return Cursor(after, expire if order is PromiseOrder.EXPIRE_TIME_ASC else None)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
