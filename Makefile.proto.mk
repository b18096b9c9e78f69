# Protobuf targets, included by the Makefile.
#
# buf is installed into ./bin rather than pinned in go.mod: its dependency
# tree is large and would leak into every build of the module. The code
# generator plugins are pinned as Go tools in go.mod instead, and buf.gen.yaml
# runs them with `go tool`, so generation needs no network after the first
# download.

BUF_VERSION ?= v1.75.0
BUF := $(CURDIR)/bin/buf
# The stamp carries the version, so changing BUF_VERSION reinstalls buf.
BUF_STAMP := $(CURDIR)/bin/.buf-$(BUF_VERSION)

$(BUF_STAMP):
	GOBIN=$(CURDIR)/bin go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	touch $@

.PHONY: proto buf-lint

# Regenerate proto/nftredir/v1/*.pb.go from the .proto files. The generated
# code is committed, so only API changes need this.
proto: $(BUF_STAMP)
	$(BUF) lint
	$(BUF) generate
	# The API's descriptors with their comments, served by reflection so
	# grpcurl describe shows the documentation.
	$(BUF) build --path proto/nftredir/v1 -o proto/nftredir/v1/nftredir.binpb

buf-lint: $(BUF_STAMP)
	$(BUF) lint
