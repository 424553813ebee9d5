"""Hostile values for the RPC fuzzer: the edge cases of issue 10, as Hypothesis strategies.

Pure: strategies only, no I/O. `_fuzz_proto` walks the request descriptors and
asks `field_hint` for a field-specific strategy (ids, globs, page tokens,
schemas, payload data, principals); every other field gets the generic
strategy of its type from here (`texts`, `blobs`, `timestamps`, `durations`,
`ints`), so a new field is fuzzed without anyone writing a strategy.

Protobuf Python refuses to serialize strings holding lone surrogates, so those
(and other invalid UTF-8) reach the server through `_fuzz_proto.raw_requests`,
which builds the wire bytes by hand.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from google.protobuf.descriptor import FieldDescriptor

# --- the pool of names the fuzzer reuses, so requests meet existing rows -------------

SEED_PREFIX = "fz"
"""Every id the fuzzer makes starts with this (or is an edge case that is refused)."""
POOL_IDS = (
    "fz-pending",
    "fz-resolved",
    "fz-schema",
    "fz-wf",
    "fz-wf.0",
    "fz-wf.1",
    "fz-a",
    "fz-b",
    "fz-a_b",
    "fz-a.1",
    "fz-new",
)
"""Seeded by the fuzz test (`fz-pending` ... `fz-wf.0`) or made by fuzzed creates."""


@dataclass(frozen=True)
class Pools:
    """Names the fuzzer reuses so that requests meet existing rows; tasks and
    counters are learned at run time (the seeded workflow's task)."""

    ids: tuple[str, ...] = POOL_IDS
    groups: tuple[str, ...] = ("fz-group", "fz-other")
    workers: tuple[str, ...] = ("fz-worker", "fz-w2")
    tasks: tuple[str, ...] = ("fz-no-such-task",)
    counters: tuple[int, ...] = (1, 2)
    page_tokens: tuple[str, ...] = ()
    """Real tokens from searches the seed made, for the fuzzer to edit."""


def rarely(
    common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int = 10
) -> st.SearchStrategy[Any]:
    """`common`, but one time in `odds` `rare` (a costly value: huge, or a long list)."""
    return st.integers(0, odds - 1).flatmap(lambda i: rare if i == 0 else common)


# --- strings -----------------------------------------------------------------------

EDGE_CHARS = (
    "\x00",  # NUL: PostgreSQL text refuses it
    "\x01",
    "\x7f",
    "\t\r\n",
    "\u00e9",  # é, 2 bytes
    "e\u0301",  # combining accent
    "\u200b",  # zero width space
    "\u202e",  # right-to-left override
    "\ufeff",  # BOM
    "\ufffd",  # replacement character
    "\uffff",  # a noncharacter
    "\U0001f600",  # outside the BMP (4 bytes; 2 UTF-16 units)
    "\U0010ffff",  # the last code point
    "\u0130",  # İ: lower() changes its length
    "\u00df",  # ß: upper() changes its length
)

GLOB_META = ("*", "**", "?", "%", "_", "[", "]", "[a-z]", "\\", "\\*", "^", "$", ".*", "(", "|")
"""Metacharacters of globs, LIKE patterns and regular expressions: only `*` is special."""

HUGE_LENGTHS = (255, 256, 257, 1024, 1025, 65_536, 65_537, 1_048_577)
"""Just under, at and over the documented limits (README, Configuration)."""


def _huge_text() -> st.SearchStrategy[str]:
    return st.builds(
        lambda n, c: c * n, st.sampled_from(HUGE_LENGTHS), st.sampled_from(("a", "\u00e9", "\x00"))
    )


def plain_texts() -> st.SearchStrategy[str]:
    """A string any validator accepts: short, letters and digits."""
    return st.text(alphabet="abcxyz019-_", max_size=12)


def texts() -> st.SearchStrategy[str]:
    """Any string protobuf can carry: empty, small, unicode edges, NUL, now and then huge."""
    common = st.one_of(
        st.just(""),
        st.text(max_size=20),
        st.lists(st.sampled_from(EDGE_CHARS), min_size=1, max_size=8).map("".join),
        st.builds(
            lambda a, c, b: a + c + b,
            st.text(max_size=5),
            st.sampled_from(EDGE_CHARS),
            st.text(max_size=5),
        ),
    )
    return rarely(common, _huge_text(), odds=25)


def ids(pool: Sequence[str] = POOL_IDS) -> st.SearchStrategy[str]:
    """A promise id: mostly one from the pool, else a fresh valid one or an edge case."""
    return st.one_of(
        st.sampled_from(pool),
        st.from_regex(r"fz-[A-Za-z0-9._~:@/+=\-]{1,12}", fullmatch=True),
        st.builds(lambda c: f"fz-{c}", st.sampled_from(EDGE_CHARS + GLOB_META)),
        texts(),
    )


def globs() -> st.SearchStrategy[str]:
    """A SearchPromises / WatchPromises id glob."""
    pieces = st.sampled_from(("fz", "-", "a", "b", "_", ".", "wf", "0", *GLOB_META))
    return st.one_of(
        st.just(""),
        st.just("*"),
        st.lists(pieces, min_size=1, max_size=8).map("".join),
        st.builds(lambda n: "*" * n, st.sampled_from((2, 100, 256, 257, 5000))),
        st.builds(lambda n: "a*" * n + "b", st.sampled_from((10, 120, 128))),  # backtracking bait
        texts(),
    )


def names(pool: Sequence[str]) -> st.SearchStrategy[str]:
    """A group, worker or task id: from the pool, or an edge case."""
    return st.one_of(st.sampled_from(pool), texts())


def principals() -> st.SearchStrategy[str | None]:
    """The `troth-principal` metadata: gRPC metadata must be printable ASCII."""
    return st.one_of(
        st.none(),
        st.sampled_from(("alice", "troth:timeout", "troth:anything", "", " ")),
        st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
        st.builds(lambda n: "p" * n, st.sampled_from((256, 257, 4000))),
    )


# --- page tokens ---------------------------------------------------------------------


def _token(fields: object) -> str:
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def edited_token(token: str, edit: tuple[str, object]) -> str:
    """A real token with one of its JSON fields changed (or removed, for `...`)."""
    fields = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    name, value = edit
    if value is ...:
        fields.pop(name, None)
    else:
        fields[name] = value
    return _token(fields)


_EDIT_VALUES: tuple[object, ...] = (
    ..., -1, 0, 10**30, 2**63, 1.5, "1", None, [], {"a": 1}, True, "CREATED_DESC",
)  # fmt: skip
TOKEN_EDITS: tuple[tuple[str, object], ...] = tuple(
    (name, value) for name in ("after", "query", "order", "expire") for value in _EDIT_VALUES
)


def page_tokens(pools: Pools) -> st.SearchStrategy[str]:
    """Forged and edited page tokens (the real format is base64url JSON `{after, query}`)."""
    real = (
        st.sampled_from(pools.page_tokens)
        if pools.page_tokens
        else st.just(_token({"after": 1, "query": "0" * 16}))
    )
    edited = st.builds(edited_token, real, st.sampled_from(TOKEN_EDITS))
    flipped = st.builds(
        lambda token, at, char: token[: at % len(token)] + char + token[at % len(token) + 1 :],
        real,
        st.integers(0, 200),
        st.sampled_from("A_-=+/!"),
    )
    numbers = st.one_of(
        st.integers(-(2**70), 2**70),
        st.sampled_from((0, -1, 1, 2**63, 2**64, 10**30, 1.5, float("1e308"), True, None, "1")),
    )
    queries = st.one_of(st.just("0" * 16), st.text(max_size=20), st.integers(), st.none())
    forged = st.builds(
        lambda after, query, order, expire: _token(
            {"after": after, "query": query, "order": order, "expire": expire}
        ),
        numbers,
        queries,
        st.one_of(st.none(), st.text(max_size=15), st.integers()),
        numbers,
    )
    nested = st.builds(
        lambda n, opener: _b64((opener * n).encode()),
        st.sampled_from((10, 1000, 3000, 100_000)),
        st.sampled_from(("[", "{", '{"a":')),
    )
    return st.one_of(
        edited,
        flipped,
        st.builds(lambda t: t + t, real),
        forged,
        nested,
        st.builds(lambda v: _b64(json.dumps(v).encode()), st.sampled_from(([], {}, "x", 1, [1]))),
        st.binary(max_size=40).map(_b64),
        st.sampled_from(("=", "==", "!!!", "a", "e30", "eyJ", "%00", "\x00")),
        texts(),
    )


# --- JSON payloads and schemas -------------------------------------------------------

REDOS_SCHEMA = '{"type":"string","pattern":"^(a+)+$"}'


def _deep(n: int, opener: str, closer: str, middle: str = "1") -> bytes:
    return (opener * n + middle + closer * n).encode()


def hostile_values() -> st.SearchStrategy[bytes]:
    """JSON (and not-JSON) bodies that make a schema check or a decoder work hard."""
    return st.one_of(
        st.builds(lambda n: json.dumps("a" * n + "!").encode(), st.integers(25, 28)),  # ReDoS
        st.builds(  # uniqueItems compares every pair
            lambda n: json.dumps([{"k": i, "v": [i, str(i)]} for i in range(n)]).encode(),
            st.integers(2000, 2600),
        ),
        st.builds(lambda n: _deep(n, "[", "]"), st.sampled_from((100, 400, 3000, 100_000))),
        st.builds(lambda n: _deep(n, '{"a":', "}"), st.sampled_from((100, 400, 3000, 100_000))),
        st.builds(lambda n: _deep(n, '{"next":', "}", "null"), st.sampled_from((50, 1000))),
        st.sampled_from((b"", b"null", b"{", b"\xff\xfe", b'"\\ud800"', b"1e999999", b"NaN")),
        st.builds(lambda n: b"[" + b"1," * n + b"1]", st.sampled_from((100_000, 400_000))),
    )


def hostile_schemas() -> st.SearchStrategy[str]:
    """Schemas that are expensive, recursive, remote, huge or not schemas at all."""
    return st.one_of(
        st.just(REDOS_SCHEMA),
        st.just('{"type":"array","uniqueItems":true}'),
        st.just('{"$defs":{"n":{"properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}'),
        st.just('{"$ref":"http://127.0.0.1:9/schema.json"}'),
        st.just('{"$ref":"#/nowhere"}'),
        st.just('{"type":"nonsense"}'),
        st.just('{"pattern":"("}'),
        st.just('{"format":"regex","pattern":"\\\\p{L}"}'),
        st.sampled_from(("", "{", "[]", "null", "1", '"x"', "{}", "true", "{\x00}")),
        st.builds(
            lambda n: '{"items":' * n + "{}" + "}" * n, st.sampled_from((50, 400, 3000, 20_000))
        ),
        st.builds(lambda n: '{"allOf":[' * n + "{}" + "]}" * n, st.sampled_from((50, 400, 3000))),
        st.builds(
            lambda n: json.dumps({"enum": [str(i) for i in range(n)]}),
            st.sampled_from((10, 10_000)),
        ),
        texts(),
    )


def payload_data() -> st.SearchStrategy[bytes]:
    huge = st.builds(lambda n: b"x" * n, st.sampled_from((1_048_575, 1_048_576, 1_048_577)))
    common = st.one_of(st.just(b""), st.binary(max_size=40), st.just(b'{"ok": true}'))
    return rarely(common, st.one_of(huge, hostile_values()), odds=8)


def json_headers() -> st.SearchStrategy[dict[str, str]]:
    return st.one_of(
        st.just({"content-type": "application/json"}),
        st.just({}),
        st.dictionaries(texts(), texts(), max_size=3),
    )


# --- times ---------------------------------------------------------------------------

_TIMESTAMP_SECONDS = (
    0,
    -1,
    1,
    -62_135_596_800,  # 0001-01-01, the protobuf minimum
    -62_135_596_801,
    253_402_300_799,  # 9999-12-31, the protobuf maximum
    253_402_300_800,
    10**11,
    10**17,  # issue 10: created_before >= 1e17 s
    2**62,
    2**63 - 1,
    -(2**63),
)
_NANOS = (0, 1, -1, 999_999_999, 1_000_000_000, 2**31 - 1, -(2**31))


def timestamps() -> st.SearchStrategy[tuple[int, int]]:
    """(seconds, nanos): far past, far future, overflowing, bad nanos, and near now."""
    now = int(time.time())
    edge = st.sampled_from(_TIMESTAMP_SECONDS)
    return st.tuples(
        st.one_of(
            edge, edge, st.integers(now - 5, now + 400 * 86_400), st.integers(-(2**63), 2**63 - 1)
        ),
        st.one_of(st.sampled_from(_NANOS), st.just(0), st.integers(-(2**31), 2**31 - 1)),
    )


def near_timestamps() -> st.SearchStrategy[tuple[int, int]]:
    """A valid time between a minute and a day from now."""
    now = int(time.time())
    return st.tuples(st.integers(now + 60, now + 86_400), st.integers(0, 999_999_999))


def short_durations() -> st.SearchStrategy[tuple[int, int]]:
    """A valid duration of 1 s to 1 h."""
    return st.tuples(st.integers(1, 3600), st.just(0))


_DURATION_SECONDS = (0, 1, -1, 60, 86_400, 366 * 86_400, 315_576_000_000, 315_576_000_001,
                     10**17, 2**63 - 1, -(2**63))  # fmt: skip


def durations() -> st.SearchStrategy[tuple[int, int]]:
    """(seconds, nanos): negative, huge, nanos out of range or of the other sign."""
    return st.tuples(
        st.one_of(st.sampled_from(_DURATION_SECONDS), st.integers(-(2**63), 2**63 - 1)),
        st.one_of(st.sampled_from(_NANOS), st.integers(-(2**31), 2**31 - 1)),
    )


# --- numbers -------------------------------------------------------------------------


def ints(bits: int, signed: bool) -> st.SearchStrategy[int]:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    edges = [v for v in (0, 1, -1, 2, 100, 1000, 1001, 65_535, 65_536, lo, hi) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


# --- which field gets which strategy --------------------------------------------------

_ID_FIELDS = {"id", "root_promise_id", "promise_ids", "suspend_on"}
_GLOB_MESSAGES = {"troth.v1.SearchPromisesRequest", "troth.v1.WatchPromisesRequest"}


def field_hint(
    field: FieldDescriptor, pools: Pools, hostile: bool = True
) -> st.SearchStrategy[Any] | None:
    """A strategy for one element of this field, when its name calls for one; else None.

    `hostile` picks the edge cases; without it, a value the server should accept
    (or answer NOT_FOUND to), so that the request gets past this field.
    """
    name = field.name
    owner = field.containing_type.full_name if field.containing_type is not None else ""
    if name == "counter":
        counters = st.sampled_from(pools.counters)
        return st.one_of(counters, ints(64, signed=True)) if hostile else counters
    if field.type not in (field.TYPE_STRING, field.TYPE_BYTES):
        return None
    hint = _HOSTILE_HINTS if hostile else _PLAUSIBLE_HINTS
    if name == "key" and owner.endswith(".TagsEntry"):
        name = "tag_key"
    elif name == "id" and owner in _GLOB_MESSAGES:
        name = "glob"
    elif name in _ID_FIELDS:
        name = "id"
    make = hint.get(name)
    return None if make is None else make(pools)


RESERVED_TAGS = (
    "troth:invoke", "troth:func", "troth:timer", "troth:kind", "troth:early", "troth:group",
    "troth:args", "troth:", "troth",
)  # fmt: skip
"""Tag keys the server reads: a root's group and workflow, a step's kind, timers."""

_HOSTILE_HINTS: dict[str, Callable[[Pools], st.SearchStrategy[Any]]] = {
    "tag_key": lambda _: st.one_of(st.sampled_from(RESERVED_TAGS), texts()),
    "glob": lambda _: globs(),
    "id": lambda pools: ids(pools.ids),
    "page_token": page_tokens,
    "schema": lambda _: st.one_of(hostile_schemas(), st.just('{"type":"object"}')),
    "data": lambda _: payload_data(),
    "group": lambda pools: names(pools.groups),
    "worker_id": lambda pools: names(pools.workers),
    "task_id": lambda pools: names(pools.tasks),
}
_PLAUSIBLE_HINTS: dict[str, Callable[[Pools], st.SearchStrategy[Any]]] = {
    "glob": lambda _: st.sampled_from(("", "*", "fz*", "fz-*", "fz-a*", "fz-wf.*", "fz-?")),
    "id": lambda pools: st.sampled_from(pools.ids),
    "page_token": lambda pools: rarely(st.just(""), st.sampled_from(("", *pools.page_tokens)), 5),
    "schema": lambda _: st.sampled_from(("", '{"type":"object"}')),
    "data": lambda _: st.sampled_from((b"", b'{"ok": true}', b'"x"')),
    "group": lambda pools: st.sampled_from(pools.groups),
    "worker_id": lambda pools: st.sampled_from(pools.workers),
    "task_id": lambda pools: st.sampled_from(pools.tasks),
}


LONG_LIST_LENGTHS = (1001, 32_767, 65_536, 70_000)
"""Lists past the bind-parameter limits of the stores (issue 10: 65,535 ids)."""


def long_lists(element: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """A very long list of small elements (one drawn element, if it is small, repeated)."""

    def spread(n: int, first: Any) -> list[Any]:
        if isinstance(first, str):
            stem = first if len(first) <= 20 and first.startswith(SEED_PREFIX) else "fz-l"
            return [f"{stem}{i}" for i in range(n)]
        if isinstance(first, bytes):
            return [first[:8]] * n
        if hasattr(first, "ByteSize") and first.ByteSize() > 64:
            return [type(first)()] * n
        return [first] * n

    return st.builds(spread, st.sampled_from(LONG_LIST_LENGTHS), element)
