# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
TRITON_ENV := .venv-triton
PYTRITON := nvidia-pytriton==0.7.0

.PHONY: setup demo test test-loaded lint typecheck unit integration bench bench-stages bench-faults bench-overload world-large clean

setup: $(VENV)/.installed $(TRITON_ENV)/.installed

# The server (recsys-serving) and the operator's tools (tools/, recsys-tools), both editable.
$(VENV)/.installed: pyproject.toml tools/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[fallback,dev,bench]' -e ./tools
	touch $@

# The local CPU Triton runs in an environment of its own, as Triton does in production.
$(TRITON_ENV)/.installed: model_repository/requirements-local.txt
	$(PYTHON) -m venv $(TRITON_ENV)
	$(TRITON_ENV)/bin/pip install --quiet -r model_repository/requirements-local.txt
	$(TRITON_ENV)/bin/pip install --quiet --no-deps $(PYTRITON)
	touch $@

# make demo WORLD=var/movies PORT=8081 serves that world as it is; without WORLD, the demo's.
demo: setup
	$(VENV)/bin/recsys demo $(if $(WORLD),--world $(WORLD)) $(if $(PORT),--port $(PORT))

test: setup lint typecheck
	$(VENV)/bin/pytest

# The same suite beside a process that keeps one core busy: a machine half taken, as CI's
# may be (it can also be two or three times slower than this one).
test-loaded: setup lint typecheck
	$(VENV)/bin/python -m loadtest.busy --cores 1 -- $(VENV)/bin/pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

unit: $(VENV)/.installed
	$(VENV)/bin/pytest tests/unit tests/tools tests/deploy

integration: setup
	$(VENV)/bin/pytest tests/integration

# CPU per request, the highest rate inside the p99 bound, the overhead around recall and rank.
bench: setup
	$(VENV)/bin/python -m loadtest.bench --out docs/benchmarks.json

# Per-stage p50 from the service's own histograms, one request at a time, on the demo world.
bench-stages: setup
	$(VENV)/bin/python -m loadtest.stage_latency

# Each dependency frozen, killed or flushed under a steady open-loop load, on the demo world.
bench-faults: setup
	$(VENV)/bin/python -m loadtest.faults --rate 100

# Capacity (a full worker), then three times it offered open loop: what admission does.
bench-overload: setup
	$(VENV)/bin/python -m loadtest.overload

world-large: setup
	$(VENV)/bin/recsys build-demo --large --world var/world-1m

clean:
	rm -rf $(VENV) $(TRITON_ENV) var .mypy_cache .ruff_cache .pytest_cache
