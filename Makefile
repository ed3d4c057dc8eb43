# moe-dag: `make demo` and `make test` each work on a fresh clone (they run `setup` first).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE := .moe_dag
CONFIG ?= configs/demo.yaml
# The CPU build of torch on a laptop or CI; on a GPU box: make setup TORCH_SPEC='torch>=2.6,<2.15' EXTRAS=dev,bench,gpu
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,bench
export DAGSTER_HOME := $(CURDIR)/$(STATE)/dagster
export MOE_DAG_CONFIG := $(CONFIG)

.PHONY: setup runtime demo test test-fast ui bench lint clean

# Everything: the graph's dependencies plus the EXTRAS (tests, benchmarks, the datatrove comparison).
setup: $(BIN)/.installed-extras $(DAGSTER_HOME)/dagster.yaml

# What the graph itself needs: `make demo` and `make ui` install no more (the extras add ~45 s).
runtime: $(BIN)/.installed $(DAGSTER_HOME)/dagster.yaml

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet '$(TORCH_SPEC)'
	$(BIN)/pip install --quiet -e .
	touch $@

$(BIN)/.installed-extras: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

# Dagster reads its instance config from $DAGSTER_HOME: all of its state stays under $(STATE)/.
$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

demo: runtime
	$(BIN)/moe-dag --config $(CONFIG) demo

test: setup system-packages
	$(BIN)/python -m pytest -q

# The quick subset while working: everything but the tests marked slow (process kills, whole-graph runs,
# the browser, PostgreSQL). CI runs the whole suite.
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

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
# commit and machine under benchmarks/results/ and regenerates the table in docs/benchmarks.md.
# BENCH=scoring (or BENCH="scoring moe_layer") runs some; BENCH_ARGS go to the scripts.
BENCH ?=
BENCH_ARGS ?=
bench: setup
	$(BIN)/python benchmarks/run_all.py $(BENCH) $(if $(BENCH_ARGS),-- $(BENCH_ARGS))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(STATE)
