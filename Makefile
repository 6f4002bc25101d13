# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
TRITON_ENV := .venv-triton
# Every install is hashed from a lock (make lock refreshes them): nothing resolved afresh.
LOCK := --generate-hashes --python-version 3.11 --quiet
# PyTorch's CPU wheels (training only; PyPI's default torch is the multi-GB CUDA build).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: setup lock demo browser java test test-loaded lint typecheck unit integration bench bench-stages bench-faults bench-overload bench-realtime profile world-large clean

setup: $(VENV)/.installed $(TRITON_ENV)/.installed java

# Set-up says one line a step; what pip says goes to the log, shown when a step fails.
SETUP_LOG := var/setup.log
QUIETLY = >>$(SETUP_LOG) 2>&1 || { tail -n 30 $(SETUP_LOG); \
  echo "set-up failed: the lines above end its log, $(SETUP_LOG)"; exit 1; }

# The server (recsys-serving) and the operator's tools (tools/, recsys-tools), both editable.
$(VENV)/.installed: pyproject.toml tools/pyproject.toml requirements/dev.lock requirements/torch.lock
	@mkdir -p var && echo "Setting up $(VENV): the service, its tools and their locked dependencies (a few minutes, once; log: $(SETUP_LOG))"
	@$(PYTHON) -m venv $(VENV) $(QUIETLY)
	@$(VENV)/bin/pip install --quiet --require-hashes --no-deps -r requirements/dev.lock $(QUIETLY)
	@$(VENV)/bin/pip install --quiet --require-hashes --no-deps --retries 1 \
	  --extra-index-url $(TORCH_INDEX) -r requirements/torch.lock $(QUIETLY)
	@$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e . -e ./tools $(QUIETLY)
	@touch $@

# The local CPU Triton runs in an environment of its own, as Triton does in production.
$(TRITON_ENV)/.installed: model_repository/requirements-local.lock model_repository/pytriton.lock
	@mkdir -p var && echo "Setting up $(TRITON_ENV): a local CPU Triton Inference Server (log: $(SETUP_LOG))"
	@$(PYTHON) -m venv $(TRITON_ENV) $(QUIETLY)
	@$(TRITON_ENV)/bin/pip install --quiet --require-hashes --no-deps \
	  -r model_repository/requirements-local.lock -r model_repository/pytriton.lock $(QUIETLY)
	@touch $@

# The one command that refreshes every lock (newest releases the .in files and pyproject.toml
# allow, each with its hashes); commit what it writes, after `make test` passes on it.
lock: $(VENV)/.installed
	$(VENV)/bin/uv pip compile $(LOCK) --torch-backend cpu requirements/dev.in \
	  -o requirements/dev.lock \
	  --no-emit-package recsys-serving --no-emit-package recsys-tools --no-emit-package torch
	$(VENV)/bin/uv pip compile $(LOCK) --torch-backend cpu --no-deps requirements/torch.in \
	  -o requirements/torch.lock
	$(VENV)/bin/uv pip compile $(LOCK) requirements/serve.in -o requirements/serve.lock \
	  --no-emit-package recsys-serving
	$(VENV)/bin/uv pip compile $(LOCK) model_repository/requirements-local.in \
	  -o model_repository/requirements-local.lock
	$(VENV)/bin/uv pip compile $(LOCK) --no-deps model_repository/pytriton.in \
	  -o model_repository/pytriton.lock

# make demo WORLD=var/movies PORT=8081 serves that world as it is; without WORLD, the demo's.
demo: setup
	@$(VENV)/bin/recsys demo $(if $(WORLD),--world $(WORLD)) $(if $(PORT),--port $(PORT))

test: setup browser lint typecheck
	$(VENV)/bin/pytest

# The same suite beside a process that keeps one core busy: a machine half taken, as CI's
# may be (it can also be two or three times slower than this one).
test-loaded: setup browser lint typecheck
	$(VENV)/bin/python -m loadtest.busy --cores 1 -- $(VENV)/bin/pytest

# The debug pages' browser test drives Debian's Chromium: installed once where it is missing
# and this is root with apt-get; elsewhere that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || { \
	  mkdir -p var; echo "Installing Debian's Chromium for the browser test (log: $(SETUP_LOG))"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	    >>$(SETUP_LOG) 2>&1 || echo "Chromium could not be installed: the browser test is skipped"; }

# build-world --engine spark runs Spark, which runs on Java (17 or newer): Debian's OpenJDK is
# installed once where no java is found and this is root with apt-get. Where Java cannot be
# had, set-up stops and says so: a run that skipped the Spark engine's tests would pass
# without them. RECSYS_SKIP_SPARK=1 runs the suite without them, on purpose (the run's
# summary says so).
java:
	@command -v java >/dev/null 2>&1 || [ -n "$$JAVA_HOME" ] || [ "$$RECSYS_SKIP_SPARK" = 1 ] || { \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; } || { \
	    echo "No Java for the Spark engine's tests, and no apt-get as root to install it:"; \
	    echo "install a Java 17 runtime, or set RECSYS_SKIP_SPARK=1 to run without them"; exit 1; }; \
	  mkdir -p var; echo "Installing Debian's OpenJDK for the Spark engine (log: $(SETUP_LOG))"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; } \
	    >>$(SETUP_LOG) 2>&1 || { echo "Java could not be installed (see $(SETUP_LOG)):"; \
	    echo "install a Java 17 runtime, or set RECSYS_SKIP_SPARK=1 to run without it"; exit 1; }; }

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

unit: $(VENV)/.installed
	$(VENV)/bin/pytest tests/unit tests/tools tests/deploy

integration: setup browser
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

# Real time: one consumer's ingest rate, the API's CPU beside events, and freshness (click
# to an answer without the item), recorded under "realtime" in docs/benchmarks.json.
bench-realtime: setup
	$(VENV)/bin/python -m loadtest.realtime --out docs/benchmarks.json

# Where the API's CPU goes at RATE requests/s: a flame graph and a table by part of the request
# path, under var/profile (py-spy samples the API without pausing it).
profile: setup
	$(VENV)/bin/python -m loadtest.profile $(if $(RATE),--rate $(RATE)) $(if $(SECONDS),--seconds $(SECONDS))

world-large: setup
	$(VENV)/bin/recsys build-demo --large --world var/world-1m

clean:
	rm -rf $(VENV) $(TRITON_ENV) var .mypy_cache .ruff_cache .pytest_cache
