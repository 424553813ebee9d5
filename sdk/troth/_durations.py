"""The one duration syntax of troth: `250ms`, `30s`, `5m`, `2h`, `3d`, and sums such as
`1h30m`, for every flag and option of the CLI and of `troth serve` (pure)."""

from __future__ import annotations

import re
from datetime import timedelta

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(rf"(?:{_PART.pattern})+")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

EXAMPLES = "e.g. 250ms, 30s, 5m, 2h, 3d or 1h30m"
_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def duration_ms(text: str) -> int | None:
    """`text` in whole milliseconds (fractions rounded down), or None if it is not a
    duration. `0` alone is 0; a unit is required otherwise."""
    cleaned = text.strip().lower()
    if cleaned == "0":
        return 0
    if not _WHOLE.fullmatch(cleaned):
        return None
    return int(sum(float(n) * _UNIT_MS[unit] for n, unit in _PART.findall(cleaned)))


def unit_hint(text: str) -> str | None:
    """For a bare number (`90`, which is no duration but `0`): how to write one."""
    cleaned = text.strip()
    if _BARE_NUMBER.fullmatch(cleaned) and cleaned != "0":
        return f"give it a unit, e.g. {cleaned}s (ms, s, m, h, d; or a sum such as 1h30m)"
    return None


def format_duration(delta: timedelta, *, exact: bool = False) -> str:
    """A duration for people, in its largest unit and the next: `3d`, `3d4h`, `2h5m`,
    `45s` (`0s` if negative); in this syntax, so `duration_ms` reads it back (rounded).

    `exact=True` (defaults and limits, which must read back as they are) writes every
    unit down to milliseconds instead: `1d`, `1h30m`, `1s500ms`, `250ms`."""
    if exact:
        return _exact(max(0, delta // timedelta(milliseconds=1)))
    seconds = max(0, int(delta.total_seconds()))
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for i, (unit, size) in enumerate(units):
        if seconds >= size or unit == "s":
            text = f"{seconds // size}{unit}"
            if i + 1 < len(units):
                next_unit, next_size = units[i + 1]
                if (rest := seconds % size // next_size) > 0:
                    text += f"{rest}{next_unit}"
            return text
    raise AssertionError("unreachable: the last unit always matches")


def _exact(ms: int) -> str:
    parts = []
    for unit, size in _UNIT_MS_DESCENDING:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


_UNIT_MS_DESCENDING = sorted(_UNIT_MS.items(), key=lambda item: -item[1])
