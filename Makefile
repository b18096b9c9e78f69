# nftredir — see README.md. `make demo` and `make test` install what they
# need (hack/deps.sh) and must be run as root: they create network
# namespaces and program nftables.

GO ?= go
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

PKGS := ./...

.PHONY: all build test unit lint lint-go demo bench deps clean

all: build

deps:
	@hack/deps.sh

# Static binaries (no cgo): they run in a scratch image and on any node,
# and nftredir-cni, exec'd once per pod and command, starts about 0.7 ms
# sooner without the dynamic loader.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/... ./tools/...

# lint checks Go and the API's protobuf (buf is built into ./bin on first
# use); make test runs the Go half only, to keep CI from compiling buf.
lint: lint-go buf-lint

lint-go:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Every test, including the real-kernel ones (root). -p 1: the kernel
# tests create namespaces and traffic; on 2 cores one package at a time is
# faster and calmer than contention.
test: deps lint-go build
	$(GO) test -p 1 -count=1 -timeout 15m $(PKGS)

# Pure tests only: no root, no kernel.
unit:
	NFTREDIR_SKIP_PRIVILEGED=1 $(GO) test -count=1 $(PKGS)

demo: deps build
	@hack/demo.sh

clean:
	rm -rf $(BIN)

include Makefile.proto.mk
include Makefile.bench.mk
