"""Search page tokens: where the next page starts, bound to the query that issued it.

Pure: no store, no clock. A token names the last row of its page by the keys
the query's order sorts on (`seq` alone for the creation orders; expire_time
and `seq` for EXPIRE_TIME_ASC), so a page starts right after it whatever was
created or settled in between, and it carries a fingerprint of the query so
that it is refused with any other query.

Tokens of the default order (CREATED_ASC, no created_before) keep the format
and fingerprint they had before orders existed, so tokens issued by an older
replica still work during a rolling upgrade.

Tokens are validated in full rather than signed (see `decode`): a signature
would need a key shared by every replica and rotated by operators, would void
the tokens of older replicas, and would protect nothing a token can reach.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troth_server.domain.errors import InvalidPageToken
from troth_server.domain.workers import After
from troth_server.store import PromiseOrder

if TYPE_CHECKING:
    from collections.abc import Mapping

    from troth_server.domain.promise import PromiseState
    from troth_server.store import WorkflowQuery


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
    parent_id: str | None = None,
) -> str:
    """A short digest of everything in a search request but its page size and token."""
    parts: list[Any] = [id_glob, sorted(states), sorted(tags.items())]
    if order is not PromiseOrder.CREATED_ASC or created_before is not None or parent_id:
        parts += [order.value, created_before]
    if parent_id is not None:
        parts.append({"parent_id": parent_id})
    canonical = json.dumps(parts)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def workflow_fingerprint(query: WorkflowQuery) -> str:
    """The digest a `SearchWorkflows` token is bound to: every filter of its search (a
    `SearchPromises` token is never one of these, nor the other way round)."""
    parts: list[Any] = [
        "workflows", query.id_glob, sorted(s.value for s in query.states),
        list(query.groups or ()), query.workflow, query.version, query.paused,
        query.waiting_for_human, query.created_after, query.created_before,
        query.newest_first, list(query.id_prefixes),
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def encode(cursor: Cursor, order: PromiseOrder, query: str) -> str:
    """The page token for the page after `cursor` of the query fingerprinted `query`."""
    fields: dict[str, Any] = {"after": cursor.seq, "query": query}
    if order is not PromiseOrder.CREATED_ASC:
        fields["order"] = order.value
    if order is PromiseOrder.EXPIRE_TIME_ASC:
        fields["expire"] = cursor.expire_time
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


MAX_TOKEN_LENGTH = 512
"""Longest page token accepted: those issued are under 200 characters."""
_MAX_INT64 = 2**63 - 1
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_-]+")
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")
# The exact keys `encode` writes for each order.
_KEYS: dict[PromiseOrder, frozenset[str]] = {
    PromiseOrder.CREATED_ASC: frozenset({"after", "query"}),
    PromiseOrder.CREATED_DESC: frozenset({"after", "query", "order"}),
    PromiseOrder.EXPIRE_TIME_ASC: frozenset({"after", "query", "order", "expire"}),
}
_ORDERS = {order.value: order for order in PromiseOrder}


_PROMISE_FILTERS = "id, states, tags, order and created_before"
WORKFLOW_FILTERS = (
    "id, states, group, workflow, workflow_version, paused, waiting_for_human, "
    "created_after, created_before and order"
)
"""What a `SearchWorkflows` request must repeat for its page token (`decode`'s `filters`)."""


def decode(token: str, order: PromiseOrder, query: str, filters: str = _PROMISE_FILTERS) -> Cursor:
    """The cursor in `token`, which must come from a search with this order and query.

    Tokens are not signed: they are validated completely instead. A token
    grants nothing (the query it pages is the request's own, which the server
    fingerprints afresh), so the one thing a forged token must never do is
    reach the store with a value it cannot take, or crash the decoder: its
    size, alphabet, JSON shape (one flat object, no repeated key), exact keys
    for its order, and every value's type and range are checked.

    Raises:
        InvalidPageToken: The token is malformed, or was issued for another search.
    """
    fields = _parse(token)
    named = fields.get("order", PromiseOrder.CREATED_ASC.value)
    issued_order = _ORDERS.get(named) if isinstance(named, str) else None
    if issued_order is None or set(fields) != _KEYS[issued_order]:
        raise _not_issued("its fields are not those of a page token")
    if issued_order is not order:
        raise InvalidPageToken(
            f"was issued for a search in order {issued_order.value}, but this request asks for "
            f"{order.value}; keep the order of the request that returned it, or start over "
            "without a page_token"
        )
    after, issued_for, expire = fields["after"], fields["query"], fields.get("expire")
    if not isinstance(issued_for, str) or not _FINGERPRINT.fullmatch(issued_for):
        raise _not_issued("its query fingerprint is malformed")
    if issued_for != query:
        raise InvalidPageToken(
            f"belongs to a different search; repeat the {filters} of the request that "
            "returned it, or start over without a page_token"
        )
    if not _in_range(after, 1):
        raise _not_issued("its position is not a row of the store")
    if not (expire is None or _in_range(expire, 0)):
        raise _not_issued("its expire time is out of range")
    return Cursor(after, expire if order is PromiseOrder.EXPIRE_TIME_ASC else None)  # type: ignore[arg-type]


_WORKER_KEYS = frozenset({"group", "worker", "principal", "query"})


def worker_fingerprint(group: str) -> str:
    """The digest a `SearchWorkers` token is bound to: its group filter."""
    return hashlib.sha256(json.dumps(["workers", group]).encode()).hexdigest()[:16]


def encode_workers(after: After, group: str) -> str:
    """The `SearchWorkers` page token for the page after worker `after`."""
    fields = {"group": after.group, "worker": after.worker_id, "principal": after.principal,
              "query": worker_fingerprint(group)}  # fmt: skip
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_workers(token: str, group: str) -> After:
    """The worker a `SearchWorkers` page token starts after; validated like `decode`.

    Raises:
        InvalidPageToken: Malformed, or issued for another group filter or search.
    """
    fields = _parse(token)
    if set(fields) != _WORKER_KEYS or not all(isinstance(v, str) for v in fields.values()):
        raise _not_issued("its fields are not those of a SearchWorkers page token")
    if not _FINGERPRINT.fullmatch(str(fields["query"])):
        raise _not_issued("its query fingerprint is malformed")
    if fields["query"] != worker_fingerprint(group):
        raise InvalidPageToken(
            "belongs to a different search; repeat the group of the request that returned "
            "it, or start over without a page_token"
        )
    return After(str(fields["group"]), str(fields["worker"]), str(fields["principal"]))


_SCHEDULE_KEYS = frozenset({"schedule", "query"})
_SCHEDULES_QUERY = "schedules"


def encode_schedules(after: str) -> str:
    """The `SearchSchedules` page token for the page after the schedule named `after`."""
    fields = {"schedule": after, "query": _SCHEDULES_QUERY}
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_schedules(token: str) -> str:
    """The schedule name a `SearchSchedules` page token starts after; validated like
    `decode` (InvalidPageToken: malformed, or issued by another search)."""
    fields = _parse(token)
    if set(fields) != _SCHEDULE_KEYS or not all(isinstance(v, str) for v in fields.values()):
        raise _not_issued("its fields are not those of a SearchSchedules page token")
    if fields["query"] != _SCHEDULES_QUERY:
        raise InvalidPageToken("belongs to a different search; start over without a page_token")
    return str(fields["schedule"])


def _parse(token: str) -> dict[str, object]:
    """The token's JSON object: flat, no key twice, from at most MAX_TOKEN_LENGTH characters."""
    if len(token) > MAX_TOKEN_LENGTH:
        raise _not_issued(
            f"it is {len(token)} characters long; tokens are under {MAX_TOKEN_LENGTH}"
        )
    if not _TOKEN_CHARS.fullmatch(token):
        raise _not_issued("it has characters outside unpadded base64url")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        # The length cap already bounds the nesting; RecursionError stays caught
        # regardless, as a deep token must never be answered INTERNAL.
        pairs = json.loads(raw, object_pairs_hook=_pairs)
    except (binascii.Error, ValueError, RecursionError):
        raise _not_issued("it is not base64url-encoded JSON") from None
    if not isinstance(pairs, _Pairs):
        raise _not_issued("it is not a JSON object")
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise _not_issued("it repeats a key")
    if any(isinstance(v, _Pairs | list) for v in fields.values()):
        raise _not_issued("it nests values")
    return fields


class _Pairs(list[tuple[str, object]]):
    """A JSON object as its (key, value) pairs, in order: repeats stay visible."""


def _pairs(pairs: list[tuple[str, object]]) -> _Pairs:
    return _Pairs(pairs)


def _not_issued(why: str) -> InvalidPageToken:
    return InvalidPageToken(
        f"is not a token this server issued ({why}); pass next_page_token from a previous "
        "response unchanged, or start over without a page_token"
    )


def _in_range(value: object, low: int) -> bool:
    return _is_int(value) and low <= value <= _MAX_INT64  # type: ignore[operator]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
