# `make demo` and `make test` set everything up themselves on a fresh Debian machine with
# Python 3.11: a virtual environment in .venv, and Debian packages only when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build; machines with a GPU may pass e.g. TORCH='torch==2.14.1'.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the tests start for real, as command:package (installed when the command is missing):
# Prometheus scrapes the agent in integration tests, headless Chromium renders the HTML report,
# systemd-analyze verifies the systemd units, promtool checks and unit-tests the alert rules, and a real
# Alertmanager delivers the rules' alerts in the dashboards' end-to-end test; node and npm run tsc, which
# checks the dashboards against Grafana's published schema; Prometheus remote-writes into a real
# VictoriaMetrics, which every dashboard query must answer from.
APT_PACKAGES := prometheus:prometheus chromium:chromium systemd-analyze:systemd promtool:prometheus \
	prometheus-alertmanager:prometheus-alertmanager node:nodejs npm:npm victoria-metrics:victoria-metrics
# The npm packages of that check (@grafana/schema, typescript), exactly as dashboards/schema/package-lock.json
# pins them; `npm ci` empties node_modules first, so the stamp inside it goes with a stale install.
NPM_STAMP := dashboards/schema/node_modules/.installed
# Benchmark-only: Holistic Trace Analysis, the baseline of benchmarks/bench_trace_vs_hta.py, lives in
# its own venv so that its heavy dependencies (jupyterlab, plotly, ...) never enter ours or `make test`.
HTA_VENV := .venv-hta
HTA_VERSION := 0.5.0
HTA_STAMP := $(HTA_VENV)/.installed-$(HTA_VERSION)

.PHONY: demo test lint types bench reliability proto dashboards apt-deps clean stack gpu-wheels gpu-check client-wheel

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,torch]' '$(TORCH)'
	touch $@

$(NPM_STAMP): dashboards/schema/package-lock.json | apt-deps
	npm ci --prefix dashboards/schema --no-audit --no-fund
	touch $@

$(HTA_STAMP):
	test -x $(HTA_VENV)/bin/python || $(PYTHON) -m venv $(HTA_VENV)
	$(HTA_VENV)/bin/python -m pip install -q --upgrade pip
	$(HTA_VENV)/bin/python -m pip install -q 'HolisticTraceAnalysis==$(HTA_VERSION)'
	touch $@

apt-deps:
	@missing=""; for pair in $(APT_PACKAGES); do \
	  command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

demo: $(STAMP)
	$(BIN)/chopper demo

# Agent, aggregator, Prometheus with the rules, Alertmanager and the demo job on this machine until
# Ctrl-C (README, "Local stack"); e.g. STACK_ARGS='--free-ports --ranks 1'.
stack: $(STAMP) apt-deps
	$(BIN)/python -m deploy.stack $(STACK_ARGS)

# Two pytest workers: most tests wait on real processes and sockets, and on CI's 2 cores two workers
# keep both cores busy (a third gained nothing: 11.0 vs 11.1 minutes). TEST_WORKERS=0 runs it serially. The fault
# scenarios (tests/faults) run afterwards, one at a time: their 2 % step-time bound needs a machine
# that no other test is loading.
TEST_WORKERS ?= 2

test: lint apt-deps $(NPM_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --ignore=tests/faults
	$(BIN)/python -m pytest tests/faults

# What `make test` checks before pytest, and what .pre-commit-config.yaml runs before each commit.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(MAKE) -s types

types: $(STAMP)
	$(BIN)/mypy chopper agent aggregator dashboards benchmarks packaging
	$(BIN)/mypy -p deploy.stack

# The thin client's wheel (docs/PACKAGING.md) into build/client-wheel/.
client-wheel: $(STAMP)
	$(BIN)/python packaging/client/build_wheel.py

bench: $(STAMP) $(HTA_STAMP)
	CHOPPER_HTA_PYTHON=$(HTA_VENV)/bin/python $(BIN)/python -m benchmarks --write docs/PERFORMANCE.md

# The GPU check (docs/GPU_CHECK.md). `make gpu-wheels`, here with network, puts the wheels the agent
# and the check need beyond what the GPU machine's python has into $(GPU_WHEELS)/ (ignored by git;
# carry it with the tree). `make gpu-check`, on the GPU machine, with its own python and no network,
# installs exactly those into a throwaway directory and runs the check, in at most five minutes
# (benchmarks/gpu/gpu_check.sh). The dry run: make gpu-check GPU_CHECK_ARGS='--backend simulated'.
GPU_PYTHON ?= python3
GPU_WHEELS := .gpu-wheels
GPU_CHECK_ARGS ?=

gpu-wheels: | $(STAMP)
	$(BIN)/python -m benchmarks.gpu.wheels --dest $(GPU_WHEELS)

gpu-check:
	GPU_PYTHON=$(GPU_PYTHON) GPU_WHEELS=$(GPU_WHEELS) sh benchmarks/gpu/gpu_check.sh $(GPU_CHECK_ARGS)

# The fault-injection suite and the bad-input tests, rendered as docs/RELIABILITY.md (every row from this run).
reliability: $(STAMP) apt-deps $(NPM_STAMP)
	$(BIN)/python -m tests.faults --write docs/RELIABILITY.md

proto: $(STAMP)
	$(BIN)/python -m chopper.proto.generate
	# The vendored kubelet pod-resources API (agent/kubelet/__init__.py).
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
	  agent/kubelet/podresources/v1/api.proto

# Grafana JSON, Prometheus rules, their Kubernetes manifests and docs/ALERTS.md, from dashboards/*.py.
dashboards: $(STAMP)
	$(BIN)/python -m dashboards

clean:
	rm -rf $(VENV) $(HTA_VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
