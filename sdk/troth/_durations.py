"""The one duration syntax of troth: `250ms`, `30s`, `5m`, `2h`, `3d`, and sums such as
`1h30m`, for every flag and option of the CLI and of `troth serve` (pure)."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(rf"(?:{_PART.pattern})+")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

EXAMPLES = "e.g. 250ms, 30s, 5m, 2h, 3d or 1h30m"


def duration_ms(text: str) -> int | None:
    """`text` in whole milliseconds (fractions rounded down), or None if it is not a
    duration. `0` alone is 0; a unit is required otherwise."""
    cleaned = text.strip().lower()
    if cleaned == "0":
        return 0
    if not _WHOLE.fullmatch(cleaned):
        return None
    return int(sum(float(n) * _UNIT_MS[unit] for n, unit in _PART.findall(cleaned)))
