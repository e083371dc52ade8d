# migpart: every install and check step lives here (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The Go testbed binary is cached outside the repo, keyed by hack/testbed/go.sum.
export MIGPART_CACHE ?= $(HOME)/.cache/migpart

.PHONY: help venv proto testbed check lint fmt typecheck layers test unit integration e2e gpu bench bench-scale chaos demo clean

help:
	@echo "make demo   - local control plane, simulated H100 nodes, operator + agents, trace replay"
	@echo "make test   - install, build the testbed (cached), run unit, integration and e2e tests"
	@echo "make check  - ruff, ruff format --check, mypy --strict, import-linter"
	@echo "make bench  - planner benchmark (bench/planner.py)"
	@echo "make chaos  - faults (agent/operator kills, NVML failures, ...) under a pod stream (bench/chaos.py)"
	@echo "make bench-scale - end to end on the testbed at 100, 300, 1,000 simulated nodes (bench/scale.py)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

proto: venv
	$(PY) -m migpart.agent.proto.build

testbed: venv
	$(PY) -m migpart.cli testbed build

lint: venv
	$(VENV)/bin/ruff check operator tests bench
	$(VENV)/bin/ruff format --check operator tests bench

fmt: venv
	$(VENV)/bin/ruff check --fix operator tests bench
	$(VENV)/bin/ruff format operator tests bench

typecheck: venv proto
	$(VENV)/bin/mypy

layers: venv
	$(VENV)/bin/lint-imports

check: lint typecheck layers

unit: venv proto
	$(PY) -m pytest tests/unit

integration: venv proto testbed
	$(PY) -m pytest tests/integration

e2e: venv proto testbed
	$(PY) -m pytest tests/e2e

# Read-only NVML checks on a machine with an NVIDIA GPU.
gpu: venv proto
	MIGPART_GPU=1 $(PY) -m pytest -m gpu tests/gpu tests/unit/agent

test: venv proto testbed
	$(PY) -m pytest tests

bench: venv
	$(PY) bench/planner.py

# End to end at scale on the testbed: minutes per size (see bench/scale.py).
bench-scale: venv proto testbed
	$(PY) bench/scale.py --sizes 100,300,1000

# Faults on a seeded schedule with an invariant monitor (bench/chaos.py); the soak:
# make chaos ARGS="--duration 1200"
chaos: venv proto testbed
	$(PY) bench/chaos.py $(ARGS)

demo: venv proto testbed
	$(PY) -m migpart.cli demo $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
