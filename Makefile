# migpart: every install and check step lives here (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The Go testbed binary is cached outside the repo, one per Kubernetes version, keyed by
# the version and the content of hack/testbed (see operator/migpart/testbed/build.py).
export MIGPART_CACHE ?= $(HOME)/.cache/migpart
# promtool (Prometheus rule checks and unit tests), taken out of Debian's `prometheus` package
# without installing it: the package would start a Prometheus server.
PROMTOOL ?= $(MIGPART_CACHE)/tools/bin/promtool
export PROMTOOL
# helm and kustomize for the chart tests (tests/tools.py finds them here), built from the Go
# module proxy by `make tools`, cached outside the repo. A stamp per version rebuilds them
# when a version below changes.
TOOLS_BIN := $(MIGPART_CACHE)/tools/bin
HELM_VERSION ?= v4.3.1
KUSTOMIZE_VERSION ?= v5.8.2
# Every Kubernetes version the integration and e2e suites run on: the oldest supported and
# the newest. MIGPART_K8S_VERSION picks one for a single run (default: the newest).
K8S_VERSIONS ?= 1.34.4 1.37.2
# Offer mode's modules also run on the first version users run it on (partitionable devices,
# device taints are beta and on by default from 1.36), beside the full
# suites: only these modules, not whole suites. An offer-mode module added here runs there too.
OFFER_K8S_VERSION ?= 1.36.3
OFFER_INTEGRATION := test_allocator_order test_allocation_mode test_offer_slices test_offer_takeover
OFFER_E2E := test_prepare_makes_room test_offer_mode test_offer_faults test_offer_crashes
OFFER_MODULES ?= $(OFFER_INTEGRATION:%=tests/integration/%.py) $(OFFER_E2E:%=tests/e2e/%.py)
# Every version `make testbed` builds (sort drops a duplicate).
TESTBED_VERSIONS := $(sort $(K8S_VERSIONS) $(OFFER_K8S_VERSION))
DEMO_K8S_VERSION ?= 1.37.2

.PHONY: help venv proto testbed promtool tools check lint fmt typecheck layers test unit integration e2e gpu bench bench-scale chaos demo clean image lock

help:
	@echo "make demo   - local control plane, simulated H100 nodes, operator + agents, trace replay"
	@echo "make test   - install, build the testbed (cached), run unit, integration and e2e tests"
	@echo "make check  - ruff, ruff format --check, mypy --strict, import-linter"
	@echo "make image  - the OCI image with buildah, no registry needed: dist/migpart-VERSION.oci.tar"
	@echo "make lock   - regenerate the image's hash-pinned locks (requirements/) from PyPI"
	@echo "make tools  - helm and kustomize for the chart tests, into \$$MIGPART_CACHE/tools/bin"
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

$(PROMTOOL):
	mkdir -p $(MIGPART_CACHE)/tools/deb $(dir $(PROMTOOL))
	cd $(MIGPART_CACHE)/tools/deb && rm -rf prometheus_*.deb root && \
		{ apt-get download prometheus || { apt-get update -q && apt-get download prometheus; }; } && \
		dpkg-deb -x prometheus_*.deb root
	install -m 0755 $(MIGPART_CACHE)/tools/deb/root/usr/bin/promtool $@
	rm -rf $(MIGPART_CACHE)/tools/deb
	$@ --version | head -1

promtool: $(PROMTOOL)

$(TOOLS_BIN)/.helm-$(HELM_VERSION):
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) go install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)
	touch $@

$(TOOLS_BIN)/.kustomize-$(KUSTOMIZE_VERSION):
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	touch $@

tools: $(TOOLS_BIN)/.helm-$(HELM_VERSION) $(TOOLS_BIN)/.kustomize-$(KUSTOMIZE_VERSION)

testbed: venv
	@for v in $(TESTBED_VERSIONS); do \
		MIGPART_K8S_VERSION=$$v $(PY) -m migpart.cli testbed build || exit 1; \
	done

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

unit: venv proto promtool tools
	$(PY) -m pytest tests/unit

integration: venv proto tools testbed
	@for v in $(K8S_VERSIONS); do \
		echo "== integration on Kubernetes $$v"; \
		MIGPART_K8S_VERSION=$$v $(PY) -m pytest tests/integration || exit 1; \
	done
	$(if $(filter tests/integration/%,$(OFFER_MODULES)),@echo "== offer-mode integration modules on Kubernetes $(OFFER_K8S_VERSION)"; \
		MIGPART_K8S_VERSION=$(OFFER_K8S_VERSION) $(PY) -m pytest $(filter tests/integration/%,$(OFFER_MODULES)))

e2e: venv proto tools testbed image
	@for v in $(K8S_VERSIONS); do \
		echo "== e2e on Kubernetes $$v"; \
		MIGPART_K8S_VERSION=$$v $(PY) -m pytest tests/e2e || exit 1; \
	done
	$(if $(filter tests/e2e/%,$(OFFER_MODULES)),@echo "== offer-mode e2e modules on Kubernetes $(OFFER_K8S_VERSION)"; \
		MIGPART_K8S_VERSION=$(OFFER_K8S_VERSION) $(PY) -m pytest $(filter tests/e2e/%,$(OFFER_MODULES)))

# Read-only NVML checks on a machine with an NVIDIA GPU.
gpu: venv proto
	MIGPART_GPU=1 $(PY) -m pytest -m gpu tests/gpu tests/unit/agent

# The unit tests, then the integration and e2e suites on each Kubernetes version and the
# offer-mode modules on OFFER_K8S_VERSION, side by side (hack/suites.sh: the unit tests run
# first in the first version's lane; MIGPART_SUITES_SERIAL=1: every part one after the other).
# Each lane builds its version's testbed when the cache lacks it (not `testbed` here): on a
# new machine the builds run beside the unit tests and the other lanes' suites.
test: venv proto promtool tools image
	PY=$(PY) SUITES_UNIT=1 OFFER_K8S_VERSION="$(OFFER_K8S_VERSION)" OFFER_MODULES="$(OFFER_MODULES)" \
		hack/suites.sh $(K8S_VERSIONS)

bench: venv
	$(PY) -m bench.planner

# End to end at scale on the testbed: minutes per size (see bench/scale.py). The agents are the
# fleet (bench/scale_fleet.py, one process and one watch).
bench-scale: venv proto testbed
	$(PY) -m bench.scale --sizes 100,300,1000

# Faults on a seeded schedule with an invariant monitor (bench/chaos.py); the soak:
# make chaos ARGS="--duration 1200"
chaos: venv proto testbed
	$(PY) -m bench.chaos $(ARGS)

demo: venv proto
	MIGPART_K8S_VERSION=$(DEMO_K8S_VERSION) $(PY) -m migpart.cli testbed build
	MIGPART_K8S_VERSION=$(DEMO_K8S_VERSION) $(PY) -m migpart.cli demo $(ARGS)

# The image (hack/image/build.sh): buildah on a Python base made from Debian packages with
# mmdebstrap (cached in $(MIGPART_CACHE)); installs buildah, mmdebstrap and skopeo with apt-get
# where missing. Prints the archive's size and the image's digest. docs/deploy.md.
image:
	hack/image/build.sh

# The locks the image installs from, with every file's hash (pip-compile from pip-tools, in its
# own virtualenv in $(MIGPART_CACHE)). Existing pins are kept while pyproject.toml allows them;
# `make lock ARGS=--upgrade` moves every pin to the newest release allowed. The gRPC pair is
# pinned in requirements/grpc.in.
PIP_TOOLS := $(MIGPART_CACHE)/tools/pip-tools
PIP_COMPILE := cd requirements && env -u PIP_FIND_LINKS CUSTOM_COMPILE_COMMAND="make lock" \
	$(PIP_TOOLS)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links $(ARGS)

$(PIP_TOOLS)/.installed:
	$(PYTHON) -m venv $(PIP_TOOLS)
	$(PIP_TOOLS)/bin/pip install -q 'pip-tools>=7.4,<8'
	touch $@

lock: $(PIP_TOOLS)/.installed
	$(PIP_COMPILE) --constraint grpc.in --output-file runtime.txt ../pyproject.toml
	$(PIP_COMPILE) --output-file build.txt build.in

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
