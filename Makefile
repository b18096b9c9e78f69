# nftredir — see README.md. `make demo` and `make test` install what they
# need (hack/deps.sh) and must be run as root: they create network
# namespaces and program nftables.

GO ?= go
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

# One build configuration for every go command run from here and the
# tests' own go builds (static, no local paths: make build's and the
# image's), so make build, go vet, go test, the e2e suite's binaries and
# its image share one compile of the dependency graph instead of three.
# make race turns cgo back on: the race detector needs it.
export CGO_ENABLED ?= 0
export GOFLAGS := $(strip -trimpath $(filter-out -trimpath,$(GOFLAGS)))

PKGS := ./...

.PHONY: all build image test unit race lint lint-go staticcheck demo bench deps deps-k8s deps-helm deps-istio e2e-k8s e2e-istio crash-storm clean fuzz

all: build

deps:
	@hack/deps.sh

# deps and the Kubernetes binaries of the cluster tests and helm, cached
# once per machine in /var/cache/nftredir (NFTREDIR_TOOLS_CACHE moves it).
deps-k8s:
	@NFTREDIR_DEPS_K8S=1 hack/deps.sh

# deps-k8s and the Istio suite's istiod, istio-cni and CRDs, cached the
# same way (hack/istio-tools.sh). The suite also needs a stock ztunnel
# binary, which is not built here: ZTUNNEL_BIN=/path/to/ztunnel.
deps-istio:
	@NFTREDIR_DEPS_K8S=1 NFTREDIR_DEPS_ISTIO=1 hack/deps.sh

# helm alone (the chart's tests in deploy/ need it), into the same cache.
deps-helm:
	@hack/helm.sh >/dev/null

# Static binaries (no cgo, no libc): they run from a scratch image and on
# any node, whatever its libc (and nftredir-cni, exec'd once per pod and
# command, starts about 0.7 ms sooner without the dynamic loader). The VCS stamp feeds --version: the
# toolchain's where it makes one, else the linker flags of
# hack/ldflags.sh, which also strips the binaries as the image does.
# VERSION (e.g. make build image VERSION=v0.3.0 IMAGE=nftredir:v0.3.0)
# stamps a release: --version and the build_info metric report it instead
# of "(devel)".
VERSION ?=
export NFTREDIR_BUILD_VERSION := $(VERSION)
build:
	@mkdir -p $(BIN)
	flags=$$(hack/ldflags.sh) && CGO_ENABLED=0 $(GO) build -buildvcs=auto -trimpath -ldflags "$$flags" -o $(BIN)/ ./cmd/... ./tools/...

# image is the scratch-style image of the static binaries for linux/amd64
# and linux/arm64 (GOARCH cross-builds), one OCI image index built offline
# (no base image, no registry), as an OCI image layout tarball:
#   ctr -n k8s.io images import bin/nftredir-image.tar   (or docker load -i, Docker 25+)
# The node's containerd unpacks its own platform. See hack/image.sh. A
# release: make image IMAGE=nftredir:v0.3.0 VERSION=v0.3.0.
IMAGE ?= nftredir:dev
image:
	@mkdir -p $(BIN)/image
	$(GO) build -o $(BIN)/ ./tools/mkimage
	MKIMAGE=$(BIN)/mkimage hack/image.sh $(BIN)/nftredir-image.tar $(IMAGE) $(BIN)/image

# lint checks Go (gofmt, vet, staticcheck at a pinned version) and the
# API's protobuf (buf and staticcheck are built into ./bin on first use);
# make test runs gofmt and vet only, to keep CI from compiling both.
lint: lint-go staticcheck buf-lint

STATICCHECK_VERSION ?= v0.8.2
staticcheck:
	@[ -x $(BIN)/staticcheck ] && [ -e $(BIN)/.staticcheck-$(STATICCHECK_VERSION) ] || \
		{ GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) && touch $(BIN)/.staticcheck-$(STATICCHECK_VERSION); }
	$(BIN)/staticcheck ./...

lint-go:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Every test, including the real-kernel ones, the Kubernetes cluster
# suite and the Istio suite (root; the Istio suite skips without
# ZTUNNEL_BIN, which .ci/run sets from ../shared/tools), then make race
# and a short make fuzz. -p 1: the kernel tests create namespaces and
# traffic; on 2 cores one package at a time is faster and calmer than
# contention. hack/test.sh builds the cluster suites' tools (deps-istio)
# in the background while the other tests run, and runs each cluster
# suite once its tools are there.
test: deps lint-go build
	@GO=$(GO) CI_FUZZTIME=$(CI_FUZZTIME) hack/test.sh

# The pure tests of the packages that run goroutines of their own (gRPC
# and ZDS servers, watchers, the probe table's sender, the CNI plugin's
# client, informers) under the race detector. Kernel tests are left out
# (NFTREDIR_SKIP_PRIVILEGED): their time is spent in the kernel, where
# the detector sees nothing, and they run above without it. The lifecycle
# and server logic tests run on capture's in-memory engine.
RACE_PKGS := ./capture/... ./lifecycle/... ./state/... ./internal/podevents \
	./client/... ./server/... ./zds/... ./kube/... ./nri/... ./probe/... ./nft/... \
	./cmd/nftredird ./cmd/nftredirctl ./cmd/nftredir-cni/... \
	./internal/health ./cmd/nftredird/internal/metrics ./internal/peercred ./internal/nftlive
race:
	CGO_ENABLED=1 NFTREDIR_SKIP_PRIVILEGED=1 $(GO) test -race -p 1 -count=1 -timeout 10m $(RACE_PKGS)

# Fuzz targets, package:name. Their seed corpora (testdata/fuzz/<name>/
# and f.Add) run in every plain go test; make fuzz searches for new
# inputs, each target for FUZZTIME, one after the other. make test runs
# each briefly (CI_FUZZTIME). A crasher is written to the package's
# testdata/fuzz/<name>/, where it stays as a regression test.
# Budgets are counts of executions, not durations: with a duration, Go
# 1.26's fuzz coordinator can fail a clean run with a bare "context
# deadline exceeded" when its deadline catches a worker mid-input
# (golang/go#75804, fixed in Go 1.27). A count has no deadline to race.
FUZZTIME ?= 1000000x
CI_FUZZTIME ?= 50000x
# FUZZFLAGS passes more go test flags, e.g. -parallel=1 on a shared machine.
FUZZFLAGS ?=
FUZZ_TARGETS := \
	./lifecycle:FuzzValidateAdd \
	./state:FuzzRecordDecode \
	./cmd/nftredir-cni/internal/plugin:FuzzParseConf \
	./cmd/nftredir-cni/internal/plugin:FuzzParseIdentity \
	./zds:FuzzWire \
	./zds:FuzzEncodeRequest

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name in $$pkg, $(FUZZTIME) executions"; \
		$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $(FUZZFLAGS) $$pkg; \
	done

# The Kubernetes cluster suite alone (e2e's TestK8s*, see internal/testkit/kcluster).
e2e-k8s: deps-k8s
	$(GO) test -count=1 -timeout 15m -run '^TestK8s' -v ./e2e/

# The crash storm, long (e2e's TestK8sCrashStorm, whose short run of 12
# kill points is part of the cluster suite): nftredird in Kubernetes mode
# SIGKILLed at CRASH_STORM_KILLS random points while namespaces and pods
# are relabelled, created and deleted and the node proxy reconnects; each
# restart is checked once it settles, and a report ends the run.
# CRASH_STORM_SEED replays a run's choices (the seed is in its output).
CRASH_STORM_KILLS ?= 200
CRASH_STORM_SEED ?=
CRASH_STORM_TIMEOUT ?= 120m
crash-storm: deps-k8s
	CRASH_STORM_KILLS=$(CRASH_STORM_KILLS) CRASH_STORM_SEED=$(CRASH_STORM_SEED) \
		$(GO) test -count=1 -timeout $(CRASH_STORM_TIMEOUT) -run '^TestK8sCrashStorm$$' -v ./e2e/

# The Istio suite alone (e2e's TestIstio*, see internal/testkit/istiotest): stock
# istiod and ztunnel on nftredir in the test cluster. Skips without
# ZTUNNEL_BIN.
e2e-istio: deps-istio
	$(GO) test -count=1 -timeout 15m -run '^TestIstio' -v ./e2e/

# Pure tests only: no root, no kernel.
unit: deps-helm
	NFTREDIR_SKIP_PRIVILEGED=1 $(GO) test -count=1 $(PKGS)

demo: deps build
	@hack/demo.sh

clean:
	rm -rf $(BIN)

include Makefile.proto.mk
include Makefile.bench.mk
