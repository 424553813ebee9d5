"""Smoke runs of `bench/approvals.py --quick`: every part on SQLite, and the
WatchPromises fan-out across two PostgreSQL replicas (the run's PostgreSQL, see
tests/_pg.py, or TROTH_BENCH_PG)."""

from __future__ import annotations

import re

import pytest
from test_bench_smoke import BENCH, _run, bench_pg


@pytest.mark.slow
def test_approvals_bench_quick_run_prints_figures() -> None:
    out = _run(str(BENCH / "approvals.py"), "--quick", "--targets", "sqlite", timeout=60)
    # (1) a row per op and kind of promise at 64 in flight, with calls and no errors.
    for op, variant in (("resolve", "plain"), ("resolve", "schema"), ("refuse", "schema")):
        row = re.search(
            rf"^sqlite\s+{op}\s+{variant}\s+64\s+([\d,]+)\s+([\d,]+)\s+\S+\s+\S+\s+(\d+)\s",
            out,
            re.MULTILINE,
        )
        assert row, f"no {op} {variant} row in:\n{out}"
        assert int(row.group(2).replace(",", "")) > 0 and row.group(3) == "0", row.group(0)
    assert re.search(r"^sqlite\s+resolve\s+64\s+\d+\.\d\d\s", out, re.MULTILINE), out  # ratio
    assert "a refused resolve answers: INVALID_ARGUMENT: value." in out, out
    # (2) each order's walk listed exactly the 200 pending approvals of g, in order,
    # before and after ANALYZE.
    for order in ("EXPIRE_TIME_ASC", "CREATED_DESC"):
        rows = re.findall(
            rf"^sqlite\s+(as loaded \(no stats\)|after ANALYZE)\s+{order}\s+(first|next)"
            r"\s+\d+(\s+[\d.]+){3}\s+200$",
            out,
            re.MULTILINE,
        )
        assert [r[:2] for r in rows] == [
            ("as loaded (no stats)", "first"),
            ("as loaded (no stats)", "next"),
            ("after ANALYZE", "first"),
            ("after ANALYZE", "next"),
        ], out
    # (3) every watcher heard every settle.
    rows = re.findall(r"^sqlite\s+one server\s+(\d+)\s+40\s+\S+\s+([\d,]+)\s+(\d+)\s", out, re.M)
    assert [(w, e, m) for w, e, m in rows] == [("1", "40", "0"), ("10", "400", "0")], out


@pytest.mark.slow
def test_approvals_bench_watch_across_two_pg_replicas() -> None:
    out = _run(str(BENCH / "approvals.py"), "--quick", "--targets", "pg", "--parts", "3",
               "--watchers", "10", timeout=40, env=bench_pg())  # fmt: skip
    # Watchers on replica B hear of every settle made through replica A.
    assert re.search(r"^pg2\s+B<-A\s+10\s+40\s+\S+\s+400\s+0\s", out, re.MULTILINE), out
    assert re.search(r"^pg\s+one server\s+10\s+40\s+\S+\s+400\s+0\s", out, re.MULTILINE), out
