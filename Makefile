# rdzv build, test and demo entry points. See docs/development.md.
SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/.tools
BIN := $(CURDIR)/bin
export PATH := $(TOOLS):$(PATH)
# go-nvml's C header trips deprecation warnings that are not ours to fix.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# Pinned code generators; `make proto` installs them with `go install`.
BUF_VERSION := v1.57.2
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

# Stamped into every binary (buildinfo); `git describe` off a checkout is "dev".
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/rdzv/rdzv/buildinfo.Version=$(VERSION) -X github.com/rdzv/rdzv/buildinfo.Commit=$(COMMIT)
# Extra linker flags: make gpu-bundle sets -s -w (stripped binaries).
STRIP_LDFLAGS ?=

# Extra flags for go test, e.g. GOTEST_FLAGS=-race (CI sets it).
GOTEST_FLAGS ?=

.PHONY: all build test unit fuzz e2e lint proto tools demo clean bench docs venv venv-oldest python-test

# Python virtualenvs with the torch stacks rdzv supports (see
# docs/versions.md): .venv has the newest torch 2.x with DeepSpeed,
# Accelerate, Transformers and Lightning; .venv-oldest the oldest torch 2.x
# supported. Both install from the pinned files in python/requirements and are
# remade only when those change. PYTHON is the interpreter they are made from.
PYTHON ?= /usr/bin/python3
VENV := $(CURDIR)/.venv
VENV_OLDEST := $(CURDIR)/.venv-oldest
PIP_QUIET ?= -q
# The venvs hold about 11 GB (torch's CUDA libraries, twice); pip's cache
# would keep another copy of every wheel. CI machines' disks vary, so the
# wheels are not cached (PIP_INSTALL="pip install" brings the cache back).
PIP_INSTALL ?= pip install --no-cache-dir $(PIP_QUIET)

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -ldflags '$(STRIP_LDFLAGS) $(LDFLAGS)' -o $(BIN)/rdzv-controller ./cmd/rdzv-controller
	CGO_ENABLED=0 $(GO) build -ldflags '$(STRIP_LDFLAGS) $(LDFLAGS)' -o $(BIN)/rdzvctl ./cmd/rdzvctl
	CGO_ENABLED=1 $(GO) build -ldflags '$(STRIP_LDFLAGS) $(LDFLAGS)' -o $(BIN)/rdzv-agent ./cmd/rdzv-agent
	CGO_ENABLED=0 $(GO) build -ldflags '$(STRIP_LDFLAGS) $(LDFLAGS)' -o $(BIN)/rdzv-relay ./cmd/rdzv-relay

$(TOOLS)/buf:
	GOBIN=$(TOOLS) GOFLAGS= $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) GOFLAGS= $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) GOFLAGS= $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc

proto: tools
	find proto -name '*.pb.go' -delete
	buf generate

lint: tools
	buf lint
	@# The committed generated code must be exactly what `make proto` makes.
	@tmp=$$(mktemp -d) && buf generate -o $$tmp && \
	  diff -r -x '*.proto' $$tmp/proto proto >/dev/null || { echo "generated code is stale: run make proto"; rm -rf $$tmp; exit 1; }; rm -rf $$tmp
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	@# Every relative link and #anchor in README.md and docs/ resolves (test/doccheck).
	$(GO) test -count=1 -run 'TestDocLinks|TestReadmeIsShort' ./test/doccheck
	@# The benchmarks are built only with their tag; keep them compiling,
	@# and the measurements their reports are made of right (no hosts, no root).
	$(GO) vet -tags bench ./test/bench/...
	$(GO) test -tags bench -count=1 -run 'TestMeasures' ./test/bench/
	@# The controller, relay and CLI must not need cgo (only agent/gpu/nvmlgpu imports go-nvml),
	@# nor must a program built on package client (examples/goclient, built so it cannot rot).
	CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/rdzv-controller ./cmd/rdzvctl ./cmd/rdzv-relay ./examples/goclient
	@# The alerting rules' syntax, where Debian's prometheus package put promtool;
	@# controller's TestDeployFilesUseExistingMetrics checks their metric names everywhere.
	@if command -v promtool >/dev/null; then promtool check rules deploy/prometheus/rdzv-alerts.yml; \
	  else echo "promtool not installed (apt-get install prometheus): alerting rules checked by go test only"; fi

# Generated references, each checked by a unit test that fails while it is
# stale: docs/cli and rdzvctl's golden files from the command tree, and
# docs/daemons.md from the daemons' --help.
docs:
	$(GO) test ./cmd/rdzvctl -run 'TestCLIDocs|Golden' -count=1 -update
	$(GO) test ./cmd/rdzv-controller ./cmd/rdzv-agent ./cmd/rdzv-relay -run 'TestFlagReference|TestConfigReference|TestCheckConfig' -count=1 -update

# agent/torchprobe's tests read the torchrun of every supported torch: the
# venvs' and Debian's.
unit: venv venv-oldest
	RDZV_VENV=$(VENV) RDZV_VENV_OLDEST=$(VENV_OLDEST) $(GO) test $(GOTEST_FLAGS) -count=1 $$($(GO) list ./... | grep -v /test/e2e)

# Each fuzz target runs for FUZZTIME; go fuzzes one target per invocation.
# Inputs that made a target fail are saved under the package's
# testdata/fuzz/<target>/ and from then on run by `make unit` as regression
# cases: commit them with the fix. A count, not a duration: with a duration
# Go's fuzzing coordinator (before go1.27, golang/go#75804) can fail a
# target with a bare "context deadline exceeded" as its time ends, having
# found nothing; it did once in .ci/run.
FUZZTIME ?= 10000x
FUZZ_TARGETS := \
	./jobspec:FuzzParse \
	./jobspec:FuzzLauncherArgs \
	./jobspec:FuzzFromShellLine \
	./controller:FuzzStartJobRequest \
	./controller:FuzzRequests \
	./controller:FuzzConnectRequest \
	./agent:FuzzReportEndpoint \
	./agent:FuzzShardRequest \
	./wire:FuzzReadFrame \
	./relay:FuzzFramedReader \
	./client:FuzzFramedReader \
	./cmd/rdzvctl:FuzzLogWriter

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$name in $$pkg for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

venv: $(VENV)/.installed
venv-oldest: $(VENV_OLDEST)/.installed

$(VENV)/.installed: python/requirements/ci.txt python/requirements/deepspeed.txt python/requirements/peers.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/$(PIP_INSTALL) --no-deps -r python/requirements/ci.txt
	@# The recovery benchmark's peers (ft_launcher, torchft): see peers.txt.
	$(VENV)/bin/$(PIP_INSTALL) --no-deps -r python/requirements/peers.txt
	DS_BUILD_OPS=0 $(VENV)/bin/$(PIP_INSTALL) --no-deps --no-build-isolation -r python/requirements/deepspeed.txt
	touch $@

$(VENV_OLDEST)/.installed: python/requirements/oldest.txt
	rm -rf $(VENV_OLDEST)
	$(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/$(PIP_INSTALL) --no-deps -r python/requirements/oldest.txt
	touch $@

# The rdzv Python package (python/, docs/python.md), installed into .venv the
# way users install it and tested there against real Transformers, Lightning,
# DeepSpeed and torch.distributed.checkpoint (-m 'not frameworks' skips
# those: PYTEST_FLAGS="-m 'not frameworks'").
PYTEST_FLAGS ?=
python-test: venv
	$(VENV)/bin/$(PIP_INSTALL) --no-deps --no-build-isolation --force-reinstall ./python
	cd python && $(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_FLAGS) tests

e2e: build venv venv-oldest
	RDZV_VENV=$(VENV) RDZV_VENV_OLDEST=$(VENV_OLDEST) RDZV_BIN_DIR=$(BIN) $(GO) test -count=1 -v -timeout 50m ./test/e2e/...

test: lint unit python-test fuzz e2e

# Every seed workload of examples/workloads (docs/workloads.md) killed
# mid-run and resumed, with the variants make e2e leaves out: ZeRO-3, the
# Hugging Face Trainer under accelerate, and each under launcher.kind warm.
.PHONY: e2e-workloads
e2e-workloads: build venv
	RDZV_WORKLOADS=all RDZV_VENV=$(VENV) RDZV_BIN_DIR=$(BIN) $(GO) test -count=1 -v -timeout 60m -run TestWorkloads ./test/e2e/

# A controller and three agents on this machine train examples/train.py
# with the venv's torch; a worker, then a node, is killed and the job
# recovers (docs/demo.md). Making the venv needs python3-venv, installed
# here when missing if we are root on Debian or Ubuntu.
demo: build python3-venv venv
	RDZV_VENV=$(VENV) ./examples/demo.sh

.PHONY: python3-venv
python3-venv:
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "== installing python3-venv"; apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv; \
	  else echo "$(PYTHON) cannot make a venv: install python3-venv (sudo apt-get install python3-venv)" >&2; exit 1; fi

# The GPU check (docs/gpu-check.md) runs on a GPU machine that may have no
# Go, make or network: make gpu-bundle here builds stripped binaries into
# bin/ (without the relay, which the check does not use: the three left
# are 59 MiB); copy the tree with bin/ there and run make gpu-check, or
# bash test/gpu/check.sh, which builds nothing.
.PHONY: gpu-bundle gpu-check
gpu-bundle:
	$(MAKE) build STRIP_LDFLAGS='-s -w'
	rm -f $(BIN)/rdzv-relay
	@du -ch $(BIN)/* | tail -1

gpu-check:
	bash test/gpu/check.sh

# Benchmarks print figures; they never gate a build.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./rendezvous/
	$(GO) test -run '^$$' -bench HeaderFlood -benchtime 1x ./relay/

# About 1 GB of training state (BENCH_STATE_MB): the step's stall for an
# in-memory checkpoint beside a durable torch.save, each load back, and a
# shard's copy between two agents over mutual TLS (replicate, fetch).
# Figures only: docs/benchmarks.md.
BENCH_STATE_MB ?= 1024
.PHONY: bench-memckpt
bench-memckpt: venv
	$(VENV)/bin/$(PIP_INSTALL) --no-deps --no-build-isolation --force-reinstall ./python
	BENCH_STATE_MB=$(BENCH_STATE_MB) $(VENV)/bin/python test/bench/bench_memckpt.py
	RDZV_BENCH_SHARD_MB=$(BENCH_STATE_MB) $(GO) test -run '^$$' -bench ShardPeerCopy -benchtime 3x ./agent/

# Recovery time after faults and goodput under a fault a minute, rdzv beside
# torchrun's elastic mode, NVIDIA's ft_launcher and torchft (from the venv:
# python/requirements/peers.txt), on netns hosts (root). Figures only; see
# test/bench/doc.go. BENCH_GOODPUT=0 skips the goodput run, BENCH_FAULTS=none
# runs only it; BENCH_SYSTEMS picks systems.
BENCH_RUNS ?= 3
BENCH_GOODPUT ?= 10m
.PHONY: bench-recovery
bench-recovery: build venv
	BENCH_RUNS=$(BENCH_RUNS) BENCH_GOODPUT=$(BENCH_GOODPUT) BENCH_VENV=$(VENV) RDZV_BIN_DIR=$(BIN) \
	  $(GO) test -tags bench -count=1 -v -timeout 180m ./test/bench/ -run TestBenchRecovery

# Failure detector false positives over a soak with one host's CPU
# saturated (root, python3-torch, tc). SOAK_DURATION=10m by default.
SOAK_DURATION ?= 10m
.PHONY: bench-soak
bench-soak: build
	SOAK_DURATION=$(SOAK_DURATION) RDZV_BIN_DIR=$(BIN) $(GO) test -tags bench -count=1 -v -timeout 60m ./test/bench/ -run TestBenchSoak

# The controller at 1,000 to 10,000 simulated agents: registration,
# heartbeats, rendezvous, recovery from a lost node, CPU and memory.
# Figures only; see test/bench/scale/doc.go. BENCH_NODES=10000 BENCH_RELAYS=1 (or 2)
# for docs/benchmarks.md's table.
BENCH_NODES ?= 1000
.PHONY: bench-scale
bench-scale: build
	BENCH_NODES=$(BENCH_NODES) RDZV_BIN_DIR=$(BIN) $(GO) test -tags bench -count=1 -v -timeout 60m ./test/bench/scale/ -run TestBenchScale

# Hostile peers against the real controller and relay on loopback (no
# certificate, foreign CA, revoked agent, a 16 MB frame header, a byte a
# second, ping flood, 1,000 unauthenticated connections, an oversized
# register, 50 concurrent 15 MB StartJob calls): each daemon's memory and
# the real agents' heartbeat latency during each. Figures only; make e2e
# runs a short version that checks the memory bounds (TestHostilePeers).
HOSTILE_DURATION ?= 30s
.PHONY: bench-hostile
bench-hostile: build
	HOSTILE_DURATION=$(HOSTILE_DURATION) RDZV_BIN_DIR=$(BIN) $(GO) test -tags bench -count=1 -v -timeout 30m ./test/bench/ -run TestBenchHostile

clean:
	rm -rf $(BIN) .demo .gpu-check $(VENV) $(VENV_OLDEST)
