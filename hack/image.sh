#!/bin/sh
# Builds the nftredir image offline: the static binaries cross-compiled
# for each platform (GOARCH; no cgo, so no cross toolchain), then one
# scratch-style image per platform under one OCI image index, written as
# an OCI image layout tarball. `ctr -n k8s.io images import` reads it and
# unpacks the node's own platform; `docker load` reads it from Docker 25,
# and registry tools read OCI layout archives (skopeo's oci-archive:).
#
#   hack/image.sh OUT.tar TAG BIN_ROOT
#
# The binaries land in BIN_ROOT/linux-<arch>/. IMAGE_PLATFORMS (default
# "linux/amd64 linux/arm64") picks the platforms; MKIMAGE overrides the
# builder (default: go run ./tools/mkimage). The binaries are linked as
# make build's (hack/ldflags.sh: no symbol table or DWARF, a third smaller,
# and stamped for --version, with NFTREDIR_BUILD_VERSION's release when it
# is set) and built without local paths (-trimpath).
set -eu
[ $# -eq 3 ] || { echo "usage: $0 OUT.tar TAG BIN_ROOT" >&2; exit 2; }
out=$1 tag=$2 root=$3
cd "$(dirname "$0")/.."
ldflags="$(hack/ldflags.sh)"
set --
for plat in ${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}; do
	os=${plat%%/*} arch=${plat#*/}
	[ "$os" = linux ] || { echo "image: $plat: only linux platforms" >&2; exit 2; }
	dir=$root/linux-$arch
	mkdir -p "$dir"
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -buildvcs=auto -trimpath -ldflags "$ldflags" \
		-o "$dir/" ./cmd/nftredird ./cmd/nftredirctl ./cmd/nftredir-cni ./cmd/nftredir-cni/nftredir-cni-helper
	set -- "$@" -platform "$plat=$dir"
done
# /tmp: the only writable path a read-only root needs (nothing writes it
# today; Go's os.TempDir points there). Everything else the daemon writes
# (socket, records, the CNI host dirs) is a mounted host path.
${MKIMAGE:-go run ./tools/mkimage} -o "$out" -tag "$tag" \
	-entrypoint /usr/local/bin/nftredird \
	-dir /tmp \
	"$@" \
	"nftredird=/usr/local/bin/nftredird:0755" \
	"nftredirctl=/usr/local/bin/nftredirctl:0755" \
	"nftredir-cni=/usr/local/bin/nftredir-cni:0755" \
	"nftredir-cni-helper=/usr/local/bin/nftredir-cni-helper:0755"
size=$(wc -c <"$out")
echo "image: $out ($tag; ${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}), $((size / 1024)) KiB"
