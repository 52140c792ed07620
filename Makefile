# fencebridge tasks. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The benchmarks' own environment: the project plus the peers they compare against (never
# dependencies of the project). `make bench BENCHMARKS=workers BENCH_ARGS=--quick` narrows a run.
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-stamp
BENCH_PEERS := 'pgqueuer[asyncpg,psycopg]==1.6.0' 'procrastinate==3.10.0' 'uvloop==0.23.0' 'awa-pg==0.6.9' 'dbos==3.4.0'
BENCHMARKS  ?= store workers fairness plans inbox sqs pubsub migrations steady

# Test processes: as many as the machine has cores (pytest-xdist's `auto`); CI names its own.
TEST_PROCESSES ?= auto
PYTEST_PARALLEL = -n $(TEST_PROCESSES) --dist loadfile

.PHONY: help test test-all demo lint format bench clean

help: ## list the tasks
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	touch $(STAMP)

test: $(STAMP) ## the fast tier: a test of every promise, in parallel, in minutes (not slow, not alone)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow and not alone" $(PYTEST_ARGS)

test-all: $(STAMP) ## every test, at volume (embedded PostgreSQL unless FENCEBRIDGE_TEST_DATABASE_URL is set)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

demo: $(STAMP) ## run the whole protocol end to end on an embedded database and a local SQS
	$(BIN)/fencebridge demo

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check bridge consumers tests bench
	$(BIN)/ruff format --check bridge consumers tests bench
	$(BIN)/mypy

format: $(STAMP) ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix bridge consumers tests bench
	$(BIN)/ruff format bridge consumers tests bench

$(BENCH_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[dev,embedded]' $(BENCH_PEERS)
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) ## run the benchmarks in .venv-bench (markdown on stdout; see docs/benchmarks.md)
	@for b in $(BENCHMARKS); do $(BENCH_VENV)/bin/python -m bench.$$b $(BENCH_ARGS) || exit 1; done

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
