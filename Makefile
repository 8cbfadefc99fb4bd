# The two commands a new user runs: `make serve` and `make test`. Both create and reuse .venv, as do
# `make test-fast` (unit tests only) and `make lint` (ruff, mypy and lint-imports' layer contracts, all
# configured in pyproject.toml; CI runs it before the tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FLAVOUR ?= cpu
HOST ?= 0.0.0.0
PORT ?= 8000
STAMP := $(VENV)/.installed-$(FLAVOUR)
# The torch build to install before the flavour's extra (2.13.0 CPU lies on this project's machines;
# elsewhere use e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu").
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv serve test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e '.[$(FLAVOUR),test]'
	touch $(STAMP)

venv: $(STAMP)

serve: venv
	$(BIN)/appliance serve --host $(HOST) --http-port $(PORT) --no-mdns

# Everything (what CI runs), the 30 slowest tests listed at the end. Test files run in parallel, one
# process a core up to 4 (pytest-xdist; a file's tests stay together, so its daemons start once):
# 27 min serial on this project's 2-core VMs, 15 min with two. TEST_JOBS=0 runs them serially.
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
test: venv
	$(BIN)/python -m pytest --durations=30 -n $(TEST_JOBS) --dist loadfile

# The unit tests only: nothing that starts a daemon, needs a GPU or takes long (a couple of minutes).
test-fast: venv
	$(BIN)/python -m pytest -m "not e2e and not slow and not gpu"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: venv
	$(BIN)/pip install --quiet -e '.[$(FLAVOUR),test,bench]'
	command -v wrk >/dev/null && command -v h2load >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk nghttp2-client)
	$(BIN)/python -m bench.serving
	$(BIN)/python -m bench.idle_rss

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .import_linter_cache
