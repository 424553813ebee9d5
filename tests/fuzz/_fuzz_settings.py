"""Settings of the fuzz and model tests: bounded for CI, longer with TROTH_FUZZ_EXAMPLES.

`TROTH_FUZZ_EXAMPLES=N` runs N examples of each test in tests/fuzz (the CI
budget is `ci_examples` of each test, a few seconds per store); the pytest
timeout grows with it. A failure prints the falsifying example (every request
in text form and as base64 wire bytes) and a `@reproduce_failure` blob.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "troth-fuzz",
    deadline=None,  # each example talks to a live server; time is the oracle's business
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)


def examples(ci_examples: int) -> int:
    """How many examples a fuzz test runs: `TROTH_FUZZ_EXAMPLES`, else its CI budget."""
    return int(os.environ.get("TROTH_FUZZ_EXAMPLES") or ci_examples)


def timeout(ci_examples: int, seconds_per_example: float) -> float:
    """The pytest timeout of a fuzz test: its examples' worth, plus a server start."""
    return 60 + examples(ci_examples) * seconds_per_example


def fuzz_settings(ci_examples: int, **overrides: object) -> settings:
    return settings(
        settings.get_profile("troth-fuzz"),
        max_examples=examples(ci_examples),
        **overrides,  # type: ignore[arg-type]
    )


def server_trouble(log: str, limit: int = 40) -> str:
    """The server log's lines worth reading after a failure: warnings, errors, and
    calls that took over a second (the log is JSON, one object a line)."""
    import json

    picked = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            picked.append(line)
            continue
        slow = isinstance(entry, dict) and (entry.get("duration_ms") or 0) > 1000
        if not isinstance(entry, dict) or entry.get("level") not in ("info", "debug") or slow:
            picked.append(line[:1000])
    return "\n".join(picked[-limit:])
