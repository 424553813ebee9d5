"""Limits and defaults in the words people read them in: durations in troth's syntax
(`366d`, `10s`, `1s500ms`), byte sizes in KiB/MiB/GiB beside the exact count (pure)."""

from __future__ import annotations

from datetime import timedelta

from troth._durations import format_duration

_BINARY_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def duration_text(ms: int) -> str:
    """Milliseconds, exactly, in the syntax every duration flag reads: `86400000` is `1d`."""
    return format_duration(timedelta(milliseconds=ms), exact=True)


def size_text(size: int) -> str:
    """A byte count: `1 MiB (1048576 bytes)`, `1.5 KiB (1536 bytes)`, `512 bytes`."""
    for unit, scale in _BINARY_UNITS:
        if size >= scale:
            amount = f"{size / scale:.1f}".removesuffix(".0")
            return f"{amount} {unit} ({size} bytes)"
    return f"{size} byte" if size == 1 else f"{size} bytes"
