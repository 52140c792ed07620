# fencebridge tasks. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The benchmarks' own environment: the project plus the peers they compare against (never
# dependencies of the project). `make bench BENCHMARKS=workers BENCH_ARGS=--quick` narrows a run.
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-stamp
BENCH_PEERS := 'pgqueuer[asyncpg,psycopg]==1.6.0' 'procrastinate==3.10.0'
BENCHMARKS  ?= store workers fairness plans inbox sqs pubsub migrations steady

.PHONY: help test demo lint format bench clean

help: ## list the tasks
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	touch $(STAMP)

test: $(STAMP) ## run the test suite (embedded PostgreSQL unless FENCEBRIDGE_TEST_DATABASE_URL is set)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

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
