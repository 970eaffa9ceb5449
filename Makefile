# The two commands a newcomer needs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The demo needs only the core (click, aiosqlite): no services, no compilers, no apt.
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test lint unit soak bench clean chromium mysqlclient-deps services

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Reinstall whenever the dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python mysqlclient-deps
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# mysqlclient (a MySQL driver the write API is tested with) compiles against libmariadb.
mysqlclient-deps:
	@pkg-config --exists libmariadb 2>/dev/null || (apt-get update -qq && \
		apt-get install -y -qq libmariadb-dev pkg-config >/dev/null)

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/outboxer demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# Debian's Chromium for the dashboard's browser test (Playwright drives /usr/bin/chromium;
# no browser is downloaded).
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# The whole suite against the real services (PostgreSQL, MariaDB, RabbitMQ, NATS, Redis here;
# the Kafka-protocol broker Tansu is started by the tests). Chaos tests (they kill relays and
# restart PostgreSQL) run afterwards, one at a time. Long soaks are `make soak`. The slowest 15
# tests are listed at the end (the suite is meant to stay under ~15 min on 2 cores).
test: lint chromium services
	$(BIN)/python -m pytest -n 2 -m "not soak and not chaos" -p no:cacheprovider --durations=15
	$(BIN)/python -m pytest -m chaos -p no:cacheprovider

# Start any of the suite's services that is down, with the command this machine uses for it.
services:
	$(PYTHON) tests/services.py

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

soak: $(STAMP)
	$(BIN)/python -m pytest -m soak -p no:cacheprovider

# The peers side by side (txoutbox, faststream-outbox) and the backlog sizes: ≈ 30 min.
# Other benchmarks: docs/benchmarks.md lists their commands.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.peers
	$(BIN)/python -m benchmarks.backlog

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
