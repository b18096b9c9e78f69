#!/usr/bin/env bash
# Builds nftredir-cni four ways into OUT (default /tmp/cnirpcbench), each
# the plugin as `make build` builds it (CGO_ENABLED=0) with only its client
# of nftredird (cmd/nftredir-cni/internal/rpc) swapped:
#   handwritten   today's client, this tree as it is
#   grpcgo        grpc-go and the generated client (package client's dial)
#   connect       connect-go (gRPC protocol) over net/http's HTTP/2,
#                 generated messages without grpc-go's stubs
#   protoruntime  today's HTTP/2 framing, AddPod through the protobuf
#                 runtime and the generated messages
# The variants are built in copies of the tree under OUT/src; the tree
# itself is not changed. connect-go is fetched through the Go module proxy
# into the copy's go.mod only. Then, as root:
#   go run ./hack/cnirpcbench -daemon bin/nftredird \
#     -build handwritten=OUT/handwritten/nftredir-cni -build grpcgo=OUT/grpcgo/nftredir-cni ...
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/cnirpcbench}
CONNECT_VERSION=v1.21.1
rm -rf "$OUT"
mkdir -p "$OUT/src"

export CGO_ENABLED=0
go build -o "$OUT/handwritten/nftredir-cni" ./cmd/nftredir-cni

for v in grpcgo connect protoruntime; do
	src="$OUT/src/$v"
	mkdir -p "$src"
	tar --exclude=./.git --exclude=./bin -cf - . | tar -C "$src" -xf -
	rpc="$src/cmd/nftredir-cni/internal/rpc"
	rm -f "$rpc"/*_test.go
	sed '1,2d' "hack/cnirpcbench/variants/$v.go" >"$rpc/client.go"
	case $v in
	grpcgo) rm "$rpc/h2.go" ;;
	connect)
		rm "$rpc/h2.go"
		mkdir -p "$src/proto/msgonly"
		cp proto/nftredir/v1/nftredir.pb.go "$src/proto/msgonly/"
		(cd "$src" && go get "connectrpc.com/connect@$CONNECT_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1)
		;;
	protoruntime)
		mkdir -p "$src/proto/msgonly"
		cp proto/nftredir/v1/nftredir.pb.go "$src/proto/msgonly/"
		;;
	esac
	(cd "$src" && go build -o "$OUT/$v/nftredir-cni" ./cmd/nftredir-cni)
done
ls -l "$OUT"/*/nftredir-cni
