"""The bounded JSON Schema validator: `jsonschema`'s keywords under a cost budget.

Every caller-controlled dimension of a check has a bound, so one request can
cost the server a known amount of CPU and no more:

- `pattern`, `patternProperties` (and the `additionalProperties` and
  `unevaluatedProperties` that consult them) run on RE2, whose matching time is
  linear in the text; a pattern RE2 cannot run is refused when the schema is
  created (`format: regex` in the metaschema check is RE2's compile);
- every keyword applied counts one step, and a check is stopped past
  `SchemaBounds.max_schema_steps` (this bounds `anyOf` trees that multiply,
  `$ref` chains, and everything else that grows with schema times value);
- keywords nested inside one another (following `$ref`s) are stopped past
  `max_check_depth`, so a `$ref` cycle that never descends into the value ends
  in an answer, not a RecursionError;
- `uniqueItems` compares in linear time (a hashable canonical form of each
  item, JSON equality: `1 == 1.0`, `true != 1`) over at most `max_unique_items`;
- `unevaluatedItems`/`unevaluatedProperties` find the evaluated members with
  sets (linear, not jsonschema's list scans) and count their steps too.

The budget of the check in progress is a context variable, so validators stay
cached per schema and shared between threads. Pure: no I/O, no clock.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import re2  # type: ignore[import-untyped]
from jsonschema import validators
from jsonschema.exceptions import ValidationError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    # jsonschema's keyword functions get the concrete validator (with `descend`,
    # `evolve`, `_resolver`), which its `Validator` protocol does not describe.
    Validator = Any
    Keyword = Callable[[Any, Any, Any, Mapping[str, Any]], Iterable[ValidationError] | None]


@dataclass(frozen=True, slots=True)
class SchemaBounds:
    """How much one schema check may cost (the server's `Limits` set these)."""

    max_schema_depth: int = 32
    """JSON nesting of a schema document."""
    max_value_depth: int = 64
    """JSON nesting of a value checked against a schema."""
    max_check_depth: int = 128
    """Keywords applied inside one another in one check, `$ref`s followed."""
    max_schema_steps: int = 50_000
    """Keywords applied in one check (plus items compared by `uniqueItems`)."""
    max_unique_items: int = 10_000
    """Items of one array that `uniqueItems` may compare."""


class OverBudget(Exception):
    """A check went past one of its bounds; `message` says which, and the flag."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Uncheckable(Exception):
    """The schema holds something the bounded validator cannot run (a stored
    pattern RE2 refuses, from before patterns were checked with RE2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Budget:
    __slots__ = ("bounds", "depth", "steps")

    def __init__(self, bounds: SchemaBounds) -> None:
        self.bounds = bounds
        self.steps = 0
        self.depth = 0

    def enter(self) -> None:
        self.steps += 1
        self.depth += 1
        if self.steps > self.bounds.max_schema_steps:
            raise OverBudget(
                f"cannot be checked within the server's budget of "
                f"{self.bounds.max_schema_steps} schema steps (limit --max-schema-steps): "
                "the schema multiplies its checks (nested anyOf/oneOf, $ref chains) over "
                "this value; simplify the schema or send a smaller value"
            )
        if self.depth > self.bounds.max_check_depth:
            raise OverBudget(
                f"cannot be checked: the schema's rules nest deeper than "
                f"{self.bounds.max_check_depth} levels when applied (limit "
                "--max-check-depth); a $ref that refers back to itself without "
                "descending into the value never ends"
            )

    def tick(self, steps: int) -> None:
        self.steps += steps
        if self.steps > self.bounds.max_schema_steps:
            self.enter()  # raises, with the message


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "troth_schema_budget", default=None
)


def run_bounded(bounds: SchemaBounds, check: Callable[[], Any]) -> Any:
    """Run `check` (which validates with a `bounded_class` validator) under a fresh
    budget. Raises OverBudget past a bound (a RecursionError is one too)."""
    token = _BUDGET.set(_Budget(bounds))
    try:
        return check()
    except RecursionError:
        # A backstop: the depth bound should end a check long before Python's.
        raise OverBudget(
            "cannot be checked: the schema's rules nest too deeply when applied "
            f"(limit --max-check-depth, {bounds.max_check_depth})"
        ) from None
    finally:
        _BUDGET.reset(token)


def _counted(keyword: Keyword) -> Keyword:
    """`keyword` counting one step, and one level of depth while it runs."""

    def counted(
        validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        budget = _BUDGET.get()
        if budget is None:  # outside `run_bounded` (never in troth): unbounded
            yield from keyword(validator, value, instance, schema) or ()
            return
        budget.enter()
        try:
            yield from keyword(validator, value, instance, schema) or ()
        finally:
            budget.depth -= 1

    functools.update_wrapper(counted, keyword)
    return counted


# --- RE2 ------------------------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is an answer, not a log line
_RE2_OPTIONS.max_mem = 8 << 20  # a pattern's compiled program (RE2's default)


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Any:
    """The RE2 program for a JSON Schema pattern. Raises re2.error if RE2 cannot run it."""
    return re2.compile(pattern, _RE2_OPTIONS)


def why_not_re2(pattern: str, error: str) -> str:
    """Why RE2 refused `pattern`, in words a schema author can act on."""
    if (
        "invalid escape sequence: \\" in error and any(f"\\{d}" in pattern for d in "123456789")
    ) or "\\k<" in pattern:
        kind = "a backreference (\\1, \\k<name>)"
    elif any(op in pattern for op in ("(?=", "(?!", "(?<=", "(?<!")):
        kind = "a lookaround ((?=, (?!, (?<=, (?<!)"
    else:
        kind = f"syntax RE2 does not accept ({error})"
    return (
        f"{pattern!r} uses {kind}: the server runs patterns on RE2, a linear-time "
        "engine with no backreferences or lookarounds, so that no value can make a "
        "check run for long; rewrite the pattern without them"
    )


def _search(pattern: str, text: str) -> bool:
    try:
        regex = compile_pattern(pattern)
    except re2.error as exc:
        raise Uncheckable(
            "cannot be checked: the promise's schema has a pattern the server cannot "
            f"run: {why_not_re2(pattern, str(exc))}; reject the promise instead"
        ) from None
    return regex.search(text) is not None


def _is_regex(value: object) -> bool:
    """`format: regex` for the metaschema check: what RE2 can compile."""
    if not isinstance(value, str):
        return True
    compile_pattern(value)
    return True


# --- the keywords that differ from jsonschema's -----------------------------------------


def _pattern(
    validator: Validator, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{clip(repr(instance))} does not match {pattern!r}")


def _pattern_properties(
    validator: Validator, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    ]


def _additional_properties(
    validator: Validator, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(clip(f"{joined} {verb} not match any of the regexes: {patterns}"))
        else:
            listed, verb = _extras(sorted(extras, key=str))
            yield ValidationError(
                clip(f"Additional properties are not allowed ({listed} {verb} unexpected)")
            )


_BOOL = object()
_LIST = object()
_OBJECT = object()


def _canonical(value: Any) -> Any:
    """A hashable form of a JSON value that is equal exactly when JSON Schema says so."""
    if isinstance(value, bool):
        return (_BOOL, value)
    if isinstance(value, list):
        return (_LIST, tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return (_OBJECT, frozenset((k, _canonical(v)) for k, v in value.items()))
    return value  # str, int, float (1 == 1.0 and hash alike), None


def _unique_items(
    validator: Validator, unique: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    budget = _BUDGET.get()
    if budget is not None:
        if len(instance) > budget.bounds.max_unique_items:
            raise OverBudget(
                f"cannot be checked: an array in it has {len(instance)} items under "
                f"uniqueItems, and the server compares at most "
                f"{budget.bounds.max_unique_items} (limit --max-unique-items); send fewer"
            )
        budget.tick(len(instance))
    seen: set[Any] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"{clip(repr(instance))} has non-unique elements")
            return
        seen.add(key)


def _extras(extras: list[Any]) -> tuple[str, str]:
    return ", ".join(repr(extra) for extra in extras), "was" if len(extras) == 1 else "were"


def _follow(validator: Validator, ref: str) -> tuple[Validator, Any]:
    resolved = validator._resolver.lookup(ref)
    evolved = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
    return evolved, resolved.contents


def _valid(validator: Validator, instance: Any, schema: Any) -> bool:
    return next(iter(validator.descend(instance, schema)), None) is None


def _evaluated_keys(validator: Validator, instance: Mapping[str, Any], schema: Any) -> set[str]:
    """jsonschema's `find_evaluated_property_keys_by_schema`, on RE2 and sets, counted."""
    if validator.is_type(schema, "boolean"):
        return set()
    budget = _BUDGET.get()
    if budget is not None:
        budget.enter()
    try:
        found: set[str] = set()
        for keyword in ("$ref", "$dynamicRef"):
            if (ref := schema.get(keyword)) is not None:
                evolved, contents = _follow(validator, ref)
                found |= _evaluated_keys(evolved, instance, contents)
        properties = schema.get("properties")
        if validator.is_type(properties, "object"):
            found |= properties.keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            if (subschema := schema.get(keyword)) is not None:
                found |= {k for k, v in instance.items() if _valid(validator, v, subschema)}
        for pattern in schema.get("patternProperties", {}):
            found |= {k for k in instance if _search(pattern, k)}
        for key, subschema in schema.get("dependentSchemas", {}).items():
            if key in instance:
                found |= _evaluated_keys(validator, instance, subschema)
        for keyword in ("allOf", "oneOf", "anyOf"):
            for subschema in schema.get(keyword, []):
                if _valid(validator, instance, subschema):
                    found |= _evaluated_keys(validator, instance, subschema)
        if "if" in schema:
            if _valid(validator, instance, schema["if"]):
                found |= _evaluated_keys(validator, instance, schema["if"])
                if "then" in schema:
                    found |= _evaluated_keys(validator, instance, schema["then"])
            elif "else" in schema:
                found |= _evaluated_keys(validator, instance, schema["else"])
        return found
    finally:
        if budget is not None:
            budget.depth -= 1


def _evaluated_indexes(validator: Validator, instance: list[Any], schema: Any) -> set[int]:
    """jsonschema's `find_evaluated_item_indexes_by_schema` (2020-12), on sets, counted."""
    if validator.is_type(schema, "boolean"):
        return set()
    if "items" in schema:
        return set(range(len(instance)))
    budget = _BUDGET.get()
    if budget is not None:
        budget.enter()
    try:
        found: set[int] = set()
        for keyword in ("$ref", "$dynamicRef"):
            if (ref := schema.get(keyword)) is not None:
                evolved, contents = _follow(validator, ref)
                found |= _evaluated_indexes(evolved, instance, contents)
        if "prefixItems" in schema:
            found |= set(range(min(len(schema["prefixItems"]), len(instance))))
        if "if" in schema:
            if _valid(validator, instance, schema["if"]):
                found |= _evaluated_indexes(validator, instance, schema["if"])
                if "then" in schema:
                    found |= _evaluated_indexes(validator, instance, schema["then"])
            elif "else" in schema:
                found |= _evaluated_indexes(validator, instance, schema["else"])
        for keyword in ("contains", "unevaluatedItems"):
            if keyword in schema:
                found |= {
                    i for i, v in enumerate(instance) if _valid(validator, v, schema[keyword])
                }
        for keyword in ("allOf", "oneOf", "anyOf"):
            for subschema in schema.get(keyword, []):
                if _valid(validator, instance, subschema):
                    found |= _evaluated_indexes(validator, instance, subschema)
        return found
    finally:
        if budget is not None:
            budget.depth -= 1


def _unevaluated_items(
    validator: Validator, unevaluated: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array"):
        return
    evaluated = _evaluated_indexes(validator, instance, schema)
    extra = [item for index, item in enumerate(instance) if index not in evaluated]
    if extra:
        listed, verb = _extras(extra)
        yield ValidationError(
            clip(f"Unevaluated items are not allowed ({listed} {verb} unexpected)")
        )


def _unevaluated_properties(
    validator: Validator, unevaluated: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    bad = [
        key
        for key in instance
        if key not in evaluated and not _valid_at(validator, instance[key], unevaluated, key)
    ]
    if not bad:
        return
    if unevaluated is False:
        listed, verb = _extras(sorted(bad, key=str))
        yield ValidationError(
            clip(f"Unevaluated properties are not allowed ({listed} {verb} unexpected)")
        )
    else:
        listed, verb = _extras(bad)
        yield ValidationError(
            clip(
                "Unevaluated properties are not valid under the given schema "
                f"({listed} {verb} unevaluated and invalid)"
            )
        )


def _valid_at(validator: Validator, value: Any, schema: Any, key: str) -> bool:
    errors = validator.descend(value, schema, path=key, schema_path=key)
    return next(iter(errors), None) is None


_REPLACED: dict[str, Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "unevaluatedItems": _unevaluated_items,
    "unevaluatedProperties": _unevaluated_properties,
}

MESSAGE_LIMIT = 300
"""Longest quoted value in an error message (a message quotes the failing value)."""


def clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


# --- values whose repr is short -------------------------------------------------------
# jsonschema writes every error's message at once, quoting the failing value (and
# parts of the schema) with repr: a check that fails 50,000 times over a 1 MB value
# would build 50 GB of text. The value and the schema are checked as these
# subclasses instead, whose repr stops after MESSAGE_LIMIT characters, so an
# error costs the same whatever it quotes. Equality, hashing, isinstance: unchanged.


def short_repr(value: Any) -> str:
    """repr(value) cut at MESSAGE_LIMIT characters, built no further than that."""
    out: list[str] = []
    room = [MESSAGE_LIMIT + 1]

    def emit(text: str) -> bool:
        out.append(text[: room[0]])
        room[0] -= len(text)
        return room[0] > 0

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            if not emit("{"):
                return False
            for i, (key, item) in enumerate(node.items()):
                if (i and not emit(", ")) or not walk(key) or not emit(": ") or not walk(item):
                    return False
            return emit("}")
        if isinstance(node, list):
            if not emit("["):
                return False
            for i, item in enumerate(node):
                if (i and not emit(", ")) or not walk(item):
                    return False
            return emit("]")
        if isinstance(node, str):
            return emit(str.__repr__(node[: MESSAGE_LIMIT + 1]))
        return emit(repr(node))

    walk(value)
    return clip("".join(out))


def _quoted_once(value: _List | _Dict) -> str:
    """A container's short repr, built on its first quote: a check that fails 50,000
    times quotes the same value 50,000 times (building it each time was two thirds
    of the costliest check's CPU). A checked value is never changed, so it stays true."""
    try:
        return value.quoted
    except AttributeError:
        value.quoted = short_repr(value)
        return value.quoted


class _List(list):  # type: ignore[type-arg]
    __slots__ = ("quoted",)
    quoted: str
    __repr__ = _quoted_once


class _Dict(dict):  # type: ignore[type-arg]
    __slots__ = ("quoted",)
    quoted: str
    __repr__ = _quoted_once


class _Str(str):
    __slots__ = ()
    __repr__ = short_repr


def quoting_briefly(value: Any) -> Any:
    """`value` (parsed JSON) with every container, and every long string, as a
    subclass whose repr is short (see above). Recursion is bounded: the caller
    checked the depth first."""
    if isinstance(value, dict):
        return _Dict((_brief_str(k), quoting_briefly(v)) for k, v in value.items())
    if isinstance(value, list):
        return _List(quoting_briefly(v) for v in value)
    if isinstance(value, str):
        return _brief_str(value)
    return value


def _brief_str(text: str) -> str:
    return _Str(text) if len(text) > MESSAGE_LIMIT else text


@functools.cache
def bounded_class(base: type[Any]) -> type[Any]:
    """`base` (a jsonschema draft's validator) with every keyword counted and the
    costly ones replaced by the bounded versions above."""
    counted = {
        name: _counted(_REPLACED.get(name, fn)) for name, fn in base.VALIDATORS.items() if fn
    }
    checker = base.FORMAT_CHECKER
    regexes = type(checker)(formats=())
    regexes.checkers = {**checker.checkers, "regex": (_is_regex, re2.error)}
    cls: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
        base, validators=counted, format_checker=regexes
    )
    return cls
