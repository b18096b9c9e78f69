#!/usr/bin/env bash
# Builds and caches, once per machine, the real Istio peers the Istio suite
# (e2e's TestIstio*) runs against: istiod (pilot-discovery), and istio-cni's
# plugin and node agent (istio-cni, install-cni), all from one pinned
# istio.io/istio module version, plus Istio's CRDs from that module.
# ztunnel is not built here: it is not a Go module; tests take its path
# from ZTUNNEL_BIN.
#
#   ${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/istio-<version>/bin
#
# A stamp per version marks a complete build. Prints the bin dir when done.
set -euo pipefail

ISTIO_VERSION=v0.0.0-20260827124520-eed52ebb66ad
CACHE="${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/istio-$ISTIO_VERSION"
BIN="$CACHE/bin"
mkdir -p "$BIN"
log() { echo "istio-tools: $*" >&2; }

exec 9>"$CACHE/.lock"
flock 9

stamp="$BIN/.istio-$ISTIO_VERSION"
if [[ ! -e $stamp ]]; then
	log "building istiod and istio-cni $ISTIO_VERSION (first time on this machine: several minutes)"
	cmds=(pilot/cmd/pilot-discovery cni/cmd/istio-cni cni/cmd/install-cni)
	mods=()
	for c in "${cmds[@]}"; do mods+=("istio.io/istio/$c@$ISTIO_VERSION"); done
	# One go install for the three (one module at one version): the
	# packages they share compile once and the links run side by side.
	CGO_ENABLED=0 GOBIN="$BIN" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" "${mods[@]}"
	dir=$(GOFLAGS=-mod=mod go mod download -json "istio.io/istio@$ISTIO_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	install -m 0644 "$dir/manifests/charts/base/files/crd-all.gen.yaml" "$BIN/crd-all.gen.yaml"
	for c in pilot-discovery istio-cni install-cni; do [[ -x $BIN/$c ]]; done
	touch "$stamp"
fi
echo "$BIN"
