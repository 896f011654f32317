# `make test` and `make demo` set up what they need: a venv with the project and its dev tools,
# and redis-server (from apt) for the Redis index tests.
VENV ?= .venv
# The interpreter the venv is made from (image-python-venv below passes the image's).
VENV_PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# vLLM's own KV-event structs and publisher are used for interop tests; installed without its deps (no torch).
VLLM_VERSION ?= 0.34.0

.PHONY: setup system-deps helm kube test unit e2e lint demo stack bench bench-routing inference-perf-venv image-python-venv clean image \
	image-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(VENV_PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# xds-protos ships an old copy of opentelemetry's protos over opentelemetry-proto's: put the real ones back.
	$(PY) -m pip install -q --no-deps --force-reinstall "opentelemetry-proto==$$($(PY) -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	$(PY) -m pip install -q --no-deps 'vllm==$(VLLM_VERSION)'
	touch $(STAMP)

setup: $(STAMP) system-deps helm

# The real helm CLI for the chart tests (tests/deploy/helm.py), built from the Go module proxy with the Go
# toolchain and kept outside the clone so that later clones on the machine reuse it (a fresh machine: ~6 min on
# 2 cores; once Go's build cache has it, seconds).
HELM_VERSION ?= v4.3.2
HELM_DIR ?= $(HOME)/.cache/pyepp/tools/helm-$(HELM_VERSION)
HELM := $(HELM_DIR)/helm
$(HELM):
	@command -v go >/dev/null 2>&1 || { echo "the chart tests need the helm CLI, built with Go (not found)"; exit 1; }
	mkdir -p $(HELM_DIR)
	GOBIN=$(HELM_DIR) GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

helm: $(HELM)

# A real kube-apiserver and etcd for the discovery tests (tests/discovery/realkube.py), built the same way from
# tools/kube/*: two go.mod files that require k8s.io/kubernetes and go.etcd.io/etcd/server/v3 from the module proxy
# and call their own main packages (a fresh machine: ~7 min of CPU for kube-apiserver, ~1 for etcd; then cached).
KUBE_VERSION ?= v1.36.3
ETCD_VERSION ?= v3.7.3
KUBE_DIR ?= $(HOME)/.cache/pyepp/tools/kube-$(KUBE_VERSION)-etcd-$(ETCD_VERSION)
KUBE_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(KUBE_VERSION:v%=%))) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION:v%=%)))
$(KUBE_DIR)/kube-apiserver: tools/kube/apiserver/go.mod tools/kube/apiserver/main.go
	mkdir -p $(KUBE_DIR)
	cd tools/kube/apiserver && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $@ .
$(KUBE_DIR)/etcd: tools/kube/etcd/go.mod tools/kube/etcd/main.go
	mkdir -p $(KUBE_DIR)
	cd tools/kube/etcd && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -o $@ .

kube: $(KUBE_DIR)/kube-apiserver $(KUBE_DIR)/etcd

system-deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (apt)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v h2load >/dev/null 2>&1 || { \
	  echo "installing h2load (apt nghttp2-client, for e2e/test_cost_external.py and the picks benchmark)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client >/dev/null; }

lint: setup
	$(PY) -m ruff check epp tests e2e examples fuzz
	$(PY) -m ruff format --check epp tests e2e examples fuzz
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache

test: lint kube
	HELM=$(HELM) KUBE_TOOLS=$(KUBE_DIR) $(PY) -m pytest -q $(PYTEST_ARGS)

unit: setup kube
	HELM=$(HELM) KUBE_TOOLS=$(KUBE_DIR) $(PY) -m pytest -q tests $(PYTEST_ARGS)

e2e: setup
	HELM=$(HELM) $(PY) -m pytest -q e2e $(PYTEST_ARGS)

demo: setup
	$(PY) -m e2e.demo

# Coverage-guided fuzzing (atheris) of the request parsers, the config loader and the KV-event decoder, each for
# FUZZ_SECONDS (fuzz/run.py; the corpus grows in .fuzz/, a crash is written there and fails the target).
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= request config kv_events
fuzz: setup
	@for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  $(PY) -m fuzz.run $$t --seconds $(FUZZ_SECONDS) 2>&1 | grep -E '^(Done|stat::|==|INFO: Seed|.*(Error|exception|crash))' \
	    || true; \
	  test -z "$$(ls .fuzz/crash-$$t-* 2>/dev/null)" || { echo "fuzz $$t: crash in .fuzz/"; exit 1; }; \
	done

# A gateway to poke at: Envoy + EPP + simulated pods until Ctrl-C (STACK_ARGS: python -m e2e.stack up --help).
STACK_ARGS ?=
stack: setup
	$(PY) -m e2e.stack up $(STACK_ARGS)

# The container image without a Docker engine: debootstrap (bookworm + Python 3.11) and buildah, as root
# (scripts/image.sh; IMAGE_TAG=... to name it). `image-check` runs it: `epp serve` from the image as uid 10001,
# gRPC health, /metrics, one request through Envoy to a simulator (e2e/image_check.py).
IMAGE_TAG ?= localhost/pyepp:dev
image:
	IMAGE_TAG=$(IMAGE_TAG) bash scripts/image.sh

image-check: setup image
	$(PY) -m e2e.image_check --image $(IMAGE_TAG)

# The interpreter the image runs (scripts/image.sh: Debian bookworm's python3.11), in a venv of its own with the
# project's dependencies: `python -m e2e.bench.cost.picks --pythons 'venv,image=.venv-image/bin/python'` measures
# under both, since the interpreter alone moves picks/s (docs/benchmarks.md). IMAGE_PYTHON=... for another one.
IMAGE_PYTHON ?= /usr/bin/python3.11
image-python-venv:
	test -x $(IMAGE_PYTHON) || { echo "no $(IMAGE_PYTHON) (Debian: apt-get install python3.11-venv)"; exit 1; }
	$(MAKE) VENV=.venv-image VENV_PYTHON=$(IMAGE_PYTHON) .venv-image/.installed-stamp

# Benchmarks (not part of `make test`): see docs/benchmarks.md for what each prints.
bench: setup
	@command -v h2load >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nghttp2-client >/dev/null; }
	$(PY) -m e2e.bench.components.scheduler
	$(PY) -m e2e.bench.index.kvcache
	$(PY) -m e2e.bench.cost.overhead
	$(PY) -m e2e.bench.cost.picks

# The routing workload suite: every strategy side by side per workload, pod count and block size (see
# docs/benchmarks.md, "Routing suite"). BENCH_ROUTING_ARGS narrows it, e.g. --workloads agentic --cells 4:16.
BENCH_ROUTING_ARGS ?=
bench-routing: setup
	$(PY) -m e2e.bench.routing.suite --plots docs/bench-routing $(BENCH_ROUTING_ARGS)

# inference-perf (kubernetes-sigs) needs Python >= 3.12: its own venv, from the machine's python3.12.
IP_PYTHON ?= $(shell command -v python3.12 || ls -d /root/.pyenv/versions/3.12*/bin/python 2>/dev/null | head -1)
.venv-ip/bin/inference-perf:
	test -n "$(IP_PYTHON)" || { echo "no python3.12 found for inference-perf"; exit 1; }
	$(IP_PYTHON) -m venv .venv-ip
	.venv-ip/bin/pip install -q inference-perf

inference-perf-venv: .venv-ip/bin/inference-perf

clean:
	rm -rf $(VENV) .venv-image .pytest_cache .mypy_cache .ruff_cache
