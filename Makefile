# One target per chore; `make help` lists them. CI runs `make ci`.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
LISTEN ?= 127.0.0.1:7070
DB ?= sqlite:///troth.db
METRICS_LISTEN ?= 127.0.0.1:9464
CONSOLE_LISTEN ?= 127.0.0.1:7080
# More `troth serve` flags for `make run` (e.g. RUN_FLAGS='--log-format json').
RUN_FLAGS ?=

help: ## Show targets
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# What serving needs, and no more: the SDK and CLI, the server, the console
# (`make run`). The development install below holds all of it, so a .venv made by
# `make install` serves without installing anything again.
$(VENV)/.serve-installed: sdk/pyproject.toml server/pyproject.toml
	@if [ $(VENV)/.installed -nt sdk/pyproject.toml ] && [ $(VENV)/.installed -nt server/pyproject.toml ]; then \
	  echo "$(VENV) has the development install, which serves too"; \
	else \
	  test -x $(PY) || python3 -m venv $(VENV); \
	  echo "installing troth and troth-server[console] into $(VENV)"; \
	  $(PY) -m pip install --quiet -e ./sdk -e './server[console]'; \
	fi
	touch $@

# Everything: the serving install, PostgreSQL support and the pinned dev tools
# (test, lint, typecheck, proto, bench, ci).
$(VENV)/.installed: sdk/pyproject.toml server/pyproject.toml requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt -e ./sdk -e './server[postgres,console]'
	touch $@ $(VENV)/.serve-installed

install-serve: $(VENV)/.serve-installed ## Create .venv with what serving needs: troth, troth-server[console] (no dev tools)

install: $(VENV)/.installed ## Create .venv with troth, troth-server[postgres,console] and the dev tools

run: install-serve ## Serve locally: auth off, SQLite ./troth.db, the console on CONSOLE_LISTEN, metrics on METRICS_LISTEN (LISTEN=, DB=, CONSOLE_LISTEN=, METRICS_LISTEN=, RUN_FLAGS= to change)
	$(VENV)/bin/troth serve --no-auth --listen $(LISTEN) --db $(DB) --console-listen $(CONSOLE_LISTEN) --metrics-listen $(METRICS_LISTEN) $(RUN_FLAGS)

proto: install ## Regenerate sdk/troth/v1 from proto/ (grpcio-tools pinned in requirements-dev.txt)
	rm -f sdk/troth/v1/*_pb2*.py sdk/troth/v1/*_pb2*.pyi
	$(PY) -m grpc_tools.protoc -I proto --python_out=sdk --pyi_out=sdk --grpc_python_out=sdk proto/troth/v1/*.proto
	touch sdk/troth/v1/__init__.py

proto-check: proto ## Regenerate, then fail if the checked-in generated code was stale
	@git diff --exit-code --stat -- sdk/troth/v1 || (echo "generated code is stale: run 'make proto' and commit" && exit 1)
	@test -z "$$(git status --porcelain -- sdk/troth/v1)" || (echo "untracked generated files: run 'make proto' and commit" && exit 1)

fmt: install ## Format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

lint: install ## ruff format --check, ruff check, the import contracts (lint-imports), buf lint and buf breaking
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/buf lint
	$(MAKE) --no-print-directory breaking

# The API as of the previous commit is the baseline: each parent of HEAD that has a
# buf.yaml (the commit that added it, and fixed the names once before any release,
# has none). BREAKING_AGAINST=REF compares with REF instead.
BREAKING_AGAINST ?=
breaking: install ## buf breaking: proto/ must stay wire- and source-compatible with the previous commit (or BREAKING_AGAINST)
	@refs="$(BREAKING_AGAINST)"; \
	if [ -z "$$refs" ]; then refs=$$(git rev-list --parents -n 1 HEAD | cut -d' ' -f2-); fi; \
	compared=0; \
	for ref in $$refs; do \
	  if git cat-file -e $$ref:buf.yaml 2>/dev/null; then \
	    echo "buf breaking --against $$ref"; \
	    $(VENV)/bin/buf breaking --against ".git#ref=$$ref" || exit 1; \
	    compared=1; \
	  fi; \
	done; \
	if [ $$compared = 0 ]; then echo "buf breaking: no earlier commit with a buf.yaml in this clone: nothing to compare with"; fi

typecheck: install ## mypy --strict on both packages
	$(VENV)/bin/mypy

test-unit: install ## Pure tests only (seconds)
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

# Three xdist workers on this 2-core machine: many slow tests wait on the wall clock
# (outages, leases, soaks, chaos runs) and leave a core idle, which a third worker
# fills (the suite: 963 s with 2, 743 s with 3; tests/loaded.sh still adds its hogs).
# worksteal: a worker that runs out of tests takes half of another's queue, so a run
# does not end with one worker idle while another works through a chunk of slow tests
# (`--dist load` hands out fixed chunks: 1127 s against 963 s with 2 workers).
TEST_WORKERS ?= 3
test: install ## Everything the README promises: unit, store, api, integration, e2e (PostgreSQL: see docs/developing.md; TEST_WORKERS=N xdist workers, default 3)
	$(VENV)/bin/pytest tests -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-loaded: install ## `make test` with 2 CPU hogs beside it (HOGS=N for more): the suite must pass on a busy machine
	tests/loaded.sh PYTEST_ARGS="$(PYTEST_ARGS)"

bench: install ## Run the benchmarks in bench/ and print their figures
	$(PY) bench/promises.py
	$(PY) bench/workflows.py
	$(PY) bench/approvals.py

bench-scale: install ## W1 and claim latency on SQLite and PostgreSQL seeded with a 100k task backlog, 1M finished and 100k parked workflows (BENCH_ARGS=--quick for a smoke run)
	$(PY) bench/scale.py $(BENCH_ARGS)

bench-peers: install ## troth beside Restate and DBOS, same workloads (installs them under bench/.cache/peers)
	$(PY) bench/peers/run.py $(BENCH_ARGS)

ci: install proto-check lint typecheck test ## What CI runs

.PHONY: help install-serve install run proto proto-check fmt lint breaking typecheck test-unit test test-loaded bench bench-scale bench-peers ci
