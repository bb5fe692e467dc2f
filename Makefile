# Everything a newcomer or CI needs; `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: help install controlplane manifests lint test check demo proto bench gpu-check interop image clean

help:
	@echo "install       create $(VENV) and install hami with its dev tools"
	@echo "controlplane  build (or reuse) etcd, kube-apiserver, kube-scheduler and helm for the tests"
	@echo "manifests     render docker/manifests from the Helm chart charts/hami (needs helm: controlplane)"
	@echo "lint          ruff, mypy and the layer contracts (import-linter)"
	@echo "test          lint, then the whole test suite (needs the control plane binaries)"
	@echo "demo          a local cluster with simulated GPU nodes, sample pods and a placement table"
	@echo "proto         regenerate the gRPC code from hami/_proto (device plugin, DRA, plugin registration)"
	@echo "bench         run the benchmarks in bench/"
	@echo "gpu-check     prove the NVIDIA backend on this machine's GPU (one line, exit 0 without one)"
	@echo "interop       Go HAMi's scheduler with this project's node agents (needs HAMI_SRC; docs/interop.md)"
	@echo "image         build the image of both roles with docker, podman or buildah (IMAGE, TAG)"

$(BIN)/hami: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(BIN)/hami

controlplane:
	bash tests/controlplane/build.sh

manifests: controlplane
	bash scripts/gen-manifests.sh

lint: install
	$(BIN)/ruff check hami tests bench
	$(BIN)/ruff format --check hami tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

proto: install
	PYTHON=$(BIN)/python bash scripts/gen-proto.sh

test: lint controlplane
	$(BIN)/pytest -q

demo: install controlplane
	$(BIN)/hami demo

# Every benchmark with its defaults, one after the other (figures: docs/performance.md).
# The defaults include 65,000-node sizes (skipped with a printed reason where memory is
# short), so this takes well over an hour on a shared 2-core VM: bench_e2e's throughput
# part alone creates 65,000 Node objects at 20-45 a second there. Each script's --help
# shows its options (--nodes picks sizes); bench_e2e.py --quick is a shorter run. Modules
# without a __main__ (bench_dra.py, _*.py) are parts of another one.
bench: install controlplane
	@for b in bench/bench_*.py; do grep -q __main__ $$b || continue; \
		echo "== $$b"; $(BIN)/python $$b || exit 1; done

gpu-check:
	@bash scripts/gpu-check.sh

interop: install controlplane
	@test -n "$$HAMI_SRC" || { echo "interop: set HAMI_SRC to a Go HAMi source tree (docs/interop.md)"; exit 2; }
	bash scripts/build-hami-go.sh >/dev/null
	$(BIN)/pytest -q -rA tests/test_interop_go.py tests/test_interop_go_mig.py \
		tests/test_interop_go_cambricon.py tests/test_interop_go_ascend.py tests/test_migration_go.py

# The chart's default image (ghcr.io/hami-py/hami:VERSION) with whatever OCI builder is
# here; says why in one line when none can run. Releases: .github/workflows/release.yaml.
image:
	@IMAGE='$(IMAGE)' TAG='$(TAG)' bash scripts/build-image.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
