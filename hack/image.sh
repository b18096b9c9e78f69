#!/bin/sh
# Builds the nftredir image offline: a scratch-style image of the static
# binaries in BIN_DIR (make build's), written as a docker-archive tarball
# that `ctr -n k8s.io images import` and `docker load` read.
#
#   hack/image.sh BIN_DIR OUT.tar TAG
#
# MKIMAGE overrides the builder (default: go run ./tools/mkimage).
set -eu
[ $# -eq 3 ] || { echo "usage: $0 BIN_DIR OUT.tar TAG" >&2; exit 2; }
bin=$1 out=$2 tag=$3
cd "$(dirname "$0")/.."
for b in nftredird nftredirctl nftredir-cni; do
	[ -x "$bin/$b" ] || { echo "image: $bin/$b is missing; run make build" >&2; exit 1; }
done
# /tmp: the only writable path a read-only root needs (nothing writes it
# today; Go's os.TempDir points there). Everything else the daemon writes
# (socket, records, the CNI host dirs) is a mounted host path.
${MKIMAGE:-go run ./tools/mkimage} -o "$out" -tag "$tag" \
	-entrypoint /usr/local/bin/nftredird \
	-dir /tmp \
	"$bin/nftredird=/usr/local/bin/nftredird:0755" \
	"$bin/nftredirctl=/usr/local/bin/nftredirctl:0755" \
	"$bin/nftredir-cni=/usr/local/bin/nftredir-cni:0755"
size=$(wc -c <"$out")
echo "image: $out ($tag), $((size / 1024)) KiB"
