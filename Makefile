# tiergate — two commands: `make demo` and `make test`. Both set everything up first.
# They use the active virtual environment if there is one, else create .venv/.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
ifdef VIRTUAL_ENV
VENV := $(VIRTUAL_ENV)
else
VENV := .venv
endif
BIN := $(VENV)/bin
STAMP := $(VENV)/.tiergate-installed

.PHONY: setup demo test test-slow check lint typecheck format bench bench-compare clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

demo: setup
	$(BIN)/tiergate demo --config deploy/config.example.yaml

lint: setup
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --no-cache --check .

typecheck: setup
	$(BIN)/mypy

check: lint typecheck

# The default suite on TEST_WORKERS processes (pytest-xdist; a test file stays on one worker, so
# its module-scoped servers start once). Most of a test's time is spent waiting on the servers it
# starts, so even 2 cores run 2 workers well; TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: check
	$(BIN)/python -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	$(BIN)/python -m pytest -m slow -q

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The overhead bench (docs/bench.md): ~17 min; BENCH_ARGS="--soak-s 60 --point-s 5" for a shorter run.
bench: setup
	$(BIN)/python -m bench.overhead $(BENCH_ARGS)

# LiteLLM's proxy for bench-compare, in a virtualenv of its own from a hash-pinned file (never
# in the project's environment).
LITELLM_VENV := bench/.venv-litellm
$(LITELLM_VENV)/.installed: bench/litellm-proxy.txt
	@test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r bench/litellm-proxy.txt
	@touch $@

# tiergate against LiteLLM's proxy, same load, one run (docs/bench.md): ~9 min, plus ~3 min
# the first time to create LiteLLM's virtualenv. BENCH_ARGS="--point-s 3" for a shorter run.
bench-compare: setup $(LITELLM_VENV)/.installed
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

clean:
	rm -rf var/ .pytest_cache .mypy_cache .ruff_cache
