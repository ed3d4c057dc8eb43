# moe-dag: `make demo` and `make test` each work on a fresh clone (they run `setup` first).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE := .moe_dag
CONFIG ?= configs/demo.yaml
# What is installed comes from two locks with hashes (docs/operating.md#set-up): LOCK, the graph's
# dependencies plus the dev and bench extras (make setup, make test, CI), and RUNTIME_LOCK, the same
# versions without the extras (make runtime, make demo). `make lock` rewrites both: the CPU build of torch
# (TORCH_SPEC) and the newest releases pyproject.toml allows. A GPU box: docs/production.md#gpus.
LOCK ?= requirements.lock
RUNTIME_LOCK ?= requirements-runtime.lock
# The MLflow tracking server (tests/test_mlflow_tracking.py; the client is the mlflow extra, in LOCK) has an
# environment of its own: every release of the full `mlflow` package caps pyarrow below the 26 in LOCK.
MLFLOW_VENV := .venv-mlflow
MLFLOW_LOCK ?= requirements-mlflow-server.lock
MLFLOW_SPEC ?= mlflow>=3.17,<4
TORCH_SPEC ?= torch==2.13.0+cpu
LOCK_EXTRAS ?= dev bench
export DAGSTER_HOME := $(CURDIR)/$(STATE)/dagster
export MOE_DAG_CONFIG := $(CONFIG)

.PHONY: setup runtime demo test test-fast ui bench figures lint clean lock lock-gpu

# Everything: the graph's dependencies plus the extras in LOCK (tests, benchmarks, the datatrove comparison).
setup: $(BIN)/.installed-extras $(MLFLOW_VENV)/.installed $(DAGSTER_HOME)/dagster.yaml

# What the graph itself needs: `make demo` and `make ui` install no more.
runtime: $(BIN)/.installed $(DAGSTER_HOME)/dagster.yaml

# Installs go through uv: the one on the PATH, else one that pip puts into the new environment first
# (2 s). The same packages from the same places as pip, in a fraction of its time (docs/operating.md#set-up).
# uv does not read pip's configuration, so PIP_SOURCES_FOR_UV hands it the indexes, find-links and
# constraints pip is configured with (pip.conf files and PIP_* variables), and it picks the best version
# over all of them, as pip does. `make setup UV=` installs with pip alone.
UV_ON_PATH := $(shell command -v uv 2>/dev/null)
# The installer is pinned like what it installs: a newer uv could read the locks differently.
UV_VERSION ?= 0.13.9
UV ?= $(or $(UV_ON_PATH),$(BIN)/uv)
UV_SOURCES = --index-strategy unsafe-best-match $$($(PYTHON) -c "$$PIP_SOURCES_FOR_UV" $(1))
INSTALL_INTO = $(if $(UV),$(UV) pip install --quiet --python $(1)/bin/python $(if $(PYTHONDONTWRITEBYTECODE),--compile-bytecode) \
	$(call UV_SOURCES,--constraints),$(1)/bin/pip install --quiet)
INSTALL = $(call INSTALL_INTO,$(VENV))
# The environment, with pip in it either way (the fallback, and `.venv/bin/pip install` in the docs).
NEW_VENV = $(if $(filter-out $(BIN)/uv,$(UV)),$(UV) venv --quiet --seed \
	--python "$$($(PYTHON) -c 'import sys; print(sys.executable)')" $(call UV_SOURCES) $(VENV),$(PYTHON) -m venv $(VENV))

# Where PYTHONDONTWRITEBYTECODE is set, Python never writes .pyc files itself, so uv compiles them at
# install, as pip always does (most of the install's time); elsewhere the first import writes them.
# Lifting the variable for make's recipes instead left a truncated .pyc in a whole test run (cause not
# found), which breaks that module's import from then on.

define PIP_SOURCES_FOR_UV
import shlex, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
settings = {}
for line in listed.splitlines():
    name, _, value = line.partition("=")
    section, _, key = name.rpartition(".")
    settings.setdefault(key, {})[section] = " ".join(shlex.split(value))
wanted = [("find-links", "--find-links"), ("extra-index-url", "--extra-index-url")]
wanted += [("constraint", "--constraints")] if "--constraints" in sys.argv else []
flags = []
for key, flag in wanted:
    for value in dict.fromkeys(v for values in settings.get(key, {}).values() for v in values.split()):
        flags += [flag, value]
if any(value.lower() in ("1", "true", "yes", "on") for value in settings.get("no-index", {}).values()):
    flags.append("--no-index")
index = settings.get("index-url", {})
for section in (":env:", "install", "global"):
    if section in index:
        flags += ["--default-index", index[section]]
        break
print(" ".join(map(shlex.quote, flags)))
endef
export PIP_SOURCES_FOR_UV

# --no-deps: the lock names every package, so nothing outside it (a second torch, a CUDA one) comes in.
# The lock's hashes are checked as it is read (uv's --verify-hashes default, pip's hash-checking mode);
# --require-hashes is left off because it also refuses the machine's unpinned pip constraints.
$(BIN)/.venv-ready:
	test -x $(BIN)/python || $(NEW_VENV)
	$(if $(filter $(BIN)/uv,$(UV)),test -x $(BIN)/uv || $(BIN)/pip install --quiet --no-compile uv==$(UV_VERSION))
	touch $@

$(BIN)/.installed: pyproject.toml $(RUNTIME_LOCK) | $(BIN)/.venv-ready
	$(INSTALL) --no-deps -r $(RUNTIME_LOCK)
	$(INSTALL) --no-deps -e .
	touch $@

$(BIN)/.installed-extras: $(BIN)/.installed $(LOCK)
	$(INSTALL) --no-deps -r $(LOCK)
	touch $@

# The MLflow server's environment, beside .venv (the uv there installs into it): `$(MLFLOW_VENV)/bin/mlflow server`.
$(MLFLOW_VENV)/.installed: $(MLFLOW_LOCK) | $(BIN)/.venv-ready
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(call INSTALL_INTO,$(MLFLOW_VENV)) --no-deps -r $(MLFLOW_LOCK)
	touch $@

# Upgrades both locks to the newest releases pyproject.toml allows, from the sources pip is configured
# with (the machine's constraints left out: the torch pin is TORCH_SPEC), reinstalls from them and runs
# the whole suite. Commit the locks with the change once it passes. The runtime lock is solved under the
# full one, so the two never disagree on a version.
LOCK_COMPILE = echo '$(TORCH_SPEC)' | $(UV) pip compile --quiet --upgrade --generate-hashes \
	--python $(BIN)/python $(call UV_SOURCES) --custom-compile-command 'make lock' pyproject.toml -
lock: | $(BIN)/.venv-ready
	$(LOCK_COMPILE) $(addprefix --extra ,$(LOCK_EXTRAS)) -o $(LOCK)
	$(LOCK_COMPILE) --constraints $(LOCK) -o $(RUNTIME_LOCK)
	echo '$(MLFLOW_SPEC)' | $(UV) pip compile --quiet --upgrade --generate-hashes --python $(BIN)/python \
		$(call UV_SOURCES) --custom-compile-command 'make lock' - -o $(MLFLOW_LOCK)
	$(MAKE) test

# The gpu extra's lock, written on a GPU box whose pip sources carry a CUDA torch (docs/production.md#gpus):
# make lock-gpu TORCH_SPEC='torch==2.13.0+cu130', then make setup LOCK=requirements-gpu.lock. Not
# committed: on a CPU machine the solve takes the CPU torch under vLLM and Transformer Engine.
lock-gpu: | $(BIN)/.venv-ready
	$(LOCK_COMPILE) $(addprefix --extra ,$(LOCK_EXTRAS) gpu) -o requirements-gpu.lock

# Dagster reads its instance config from $DAGSTER_HOME: all of its state stays under $(STATE)/.
$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

demo: runtime
	$(BIN)/moe-dag --config $(CONFIG) demo

# Two pytest workers: on its own the suite keeps ~0.55 of a core busy (most tests wait on processes,
# Ray and torchrun starting), and the slow tests start first (tests/conftest.py), so the longest one
# does not start last. TEST_WORKERS=0 runs in one process. The 25 longest tests close the report, so a
# CI log says where the suite's time went.
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -q --durations=25 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal)

test: setup system-packages
	$(PYTEST)

# The quick subset while working: everything but the tests marked slow (process kills, whole-graph runs,
# the browser, PostgreSQL). CI runs the whole suite.
test-fast: setup
	$(PYTEST) -m "not slow"

# Debian packages for the PostgreSQL instance test and the browser test of the UI. Installed once as
# root (quietly; skipped when present); elsewhere it says what is missing and those tests skip.
SYSTEM_PACKAGES := postgresql chromium chromium-driver
.PHONY: system-packages
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "apt-get install" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "not installed:" $$missing "(as root: apt-get install" $$missing"); their tests skip"; fi

ui: runtime
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000

# Every benchmark through benchmarks/run_all.py, which records each one's last JSON line with the date,
# commit and machine under benchmarks/results/, then re-renders every generated figures block in README.md
# and docs/*.md from the newest records (a page quotes a measured figure nowhere else; make figures
# re-renders without running anything, tests/test_doc_figures.py checks). Benchmarks run as modules of the
# benchmarks package, never as scripts (benchmarks/__init__.py says why).
# BENCH=scoring (or BENCH="scoring moe_layer") runs some; BENCH_ARGS go to the scripts; BENCH_SMOKE="a b"
# runs those at their smoke size (recorded, never quoted), for a whole run that must fit a time.
BENCH ?=
BENCH_ARGS ?=
BENCH_SMOKE ?=
bench: setup
	$(BIN)/python -m benchmarks.run_all $(BENCH) $(if $(BENCH_SMOKE),--smoke $(BENCH_SMOKE)) $(if $(BENCH_ARGS),-- $(BENCH_ARGS))

figures: runtime
	$(BIN)/python -m benchmarks.run_all --render

# On a CUDA machine (after make setup LOCK=requirements-gpu.lock): the benchmarks that need CUDA, through
# run_all so they are recorded, then the tests that check them at their smoke sizes, within 8 minutes in
# all. No test in the suite needs CUDA otherwise (the kernel tests run in Triton's interpreter). On CPU it
# says what it would run and exits 0.
GPU_BENCHMARKS := kernel_speed training_gpu scoring_gpu
GPU_CHECK_RUN := $(BIN)/python -m benchmarks.run_all $(GPU_BENCHMARKS)
GPU_CHECK_TESTS := $(BIN)/python -m pytest -q tests/test_benchmark_smoke.py -k '$(subst $() , or ,$(GPU_BENCHMARKS))'
.PHONY: gpu-check
gpu-check:
	@if $(BIN)/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then \
		timeout 480 sh -c "$(GPU_CHECK_RUN) && $(GPU_CHECK_TESTS)"; \
	else \
		echo "no CUDA device: nothing run. On a CUDA machine make gpu-check runs, within 8 minutes:"; \
		echo "  $(GPU_CHECK_RUN)"; \
		echo "  $(GPU_CHECK_TESTS)"; \
	fi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(STATE)
