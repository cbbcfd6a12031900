# `make demo` runs the gateway on its embedded default; `make test` runs the whole suite.
# Both create .venv when it is missing and install into it.
# `make test-engines` runs the real-engine tier: real SGLang and vLLM on this machine's CPU, installed once into
# venvs in a cache directory outside the repo (`make engines`; see docs/testing.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-engines engines capture-fixtures lint bench-hot-path clean

$(VENV)/.runtime: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	@touch $@

$(VENV)/.test: $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

demo: $(VENV)/.runtime  # `make demo PORT=9000` to listen elsewhere than 8080
	$(VENV)/bin/spillgate serve $(if $(PORT),--port $(PORT))

# The suite runs on TEST_WORKERS processes (pytest-xdist): its tests mostly wait for the processes they start.
TEST_WORKERS ?= 2

test: $(VENV)/.test redis-server chromium
	$(PY) -m ruff check gateway policies backends cache tests
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# Exit status 3 from the installer means this machine cannot run the engines: the tier says so in one line and
# passes, unless SPILLGATE_REQUIRE_ENGINES is set (CI), where it fails.
engines: $(VENV)/.test
	@$(PY) -m tests.engines.install; rc=$$?; \
	if [ $$rc = 3 ] && [ -z "$$SPILLGATE_REQUIRE_ENGINES" ]; then echo "real-engine tier skipped"; \
	elif [ $$rc != 0 ]; then exit $$rc; fi

test-engines: engines redis-server
	@if $(PY) -c 'import sys; from tests.engines.install import installed_already; sys.exit(installed_already() is None)'; \
	then $(PY) -m pytest -q -m engines --durations=10 tests/engines; \
	else echo "real-engine tier skipped: SGLang and vLLM are not installed here"; fi

capture-fixtures: engines
	$(PY) -m tests.engines.capture
	$(PY) -m tests.engines.capture --features
	$(PY) -m tests.engines.capture --responses

lint: $(VENV)/.test
	$(PY) -m ruff check gateway policies backends cache tests
	$(PY) -m ruff format --check gateway policies backends cache tests

# Tests start their own redis-server when REDIS_URL is not set, so the binary must exist.
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else echo "redis-server is missing: install it (sudo apt-get install redis-server)" >&2; exit 1; fi; }

# The dashboard's browser test drives Debian's chromium through Playwright (no browser download).
.PHONY: chromium
chromium:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium is missing: install it (sudo apt-get install chromium)" >&2; exit 1; fi; }

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
