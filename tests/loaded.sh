#!/usr/bin/env bash
# `make test` with CPU hogs beside it: what a laptop compiling something amounts to.
# The suite must pass so; run it before a change that touches timing, waits or
# processes. HOGS=N sets how many (default 2); arguments go to `make test`
# (e.g. tests/loaded.sh PYTEST_ARGS=-x). The hogs are killed however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for _ in $(seq 1 "${HOGS:-2}"); do
  python3 -c 'while True: pass' &
  hogs+=("$!")
done
echo "loaded.sh: ${#hogs[@]} CPU hogs running (pids ${hogs[*]}); make test $*" >&2
# Two xdist workers beside the hogs, the load this script was made for (make test runs
# three on a quiet machine: with three and two hogs, five CPU-bound loads on two cores,
# the CPU-starvation test's callers ran past its 60 s limit).
make test TEST_WORKERS="${TEST_WORKERS:-2}" "$@"
