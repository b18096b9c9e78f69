#!/usr/bin/env bash
# Builds and caches, once per machine, what the single-node Kubernetes test
# cluster (internal/testkit/kcluster, e2e/k8s) runs: kube-apiserver, kubelet,
# kube-controller-manager, kube-scheduler and kubectl, etcd, and containerd
# with its runc shim and ctr, each at one pinned version built from the Go
# module proxy (static, CGO_ENABLED=0); runc extracted from Debian's package
# (never installed, so no service is started).
#
# The cache lives outside the clone so that fresh clones (CI) reuse it:
#   ${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/k8s-<version>/bin
# A stamp file per part marks a complete build; an interrupted build is
# redone on the next run. Prints the bin dir on stdout when done.
set -euo pipefail

K8S_VERSION=v1.34.4
# kubelet 1.35+ refuses cgroup v1 by default, and this kind of machine has
# a hybrid hierarchy: stay on 1.34. containerd 2.4 supports kubelets from
# 1.32 on.
STAGING_VERSION=v0.${K8S_VERSION#v1.}
# containerd 2.x: NRI on by default, its default validator (required
# plugins) from 2.2; Debian's 1.6 has neither.
CONTAINERD_VERSION=v2.4.2
# The etcd kubeadm installs with this Kubernetes release; Debian's 3.4.23
# lacks the health endpoints apiservers from 1.31 on expect (3.4.29+, 3.5.11+).
ETCD_VERSION=v3.6.5
DEBIAN_PKGS=(runc)

CACHE="${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/k8s-$K8S_VERSION"
BIN="$CACHE/bin"
mkdir -p "$BIN"
log() { echo "k8s-tools: $*" >&2; }

# One flock per cache dir: two clones building at once would otherwise
# race on the same files.
exec 9>"$CACHE/.lock"
flock 9

build_kube() {
	local stamp="$BIN/.kube-$K8S_VERSION"
	[[ -e $stamp ]] && return 0
	local src="$CACHE/src"
	rm -rf "$src"
	mkdir -p "$src"
	log "building Kubernetes $K8S_VERSION binaries (first time on this machine: several minutes)"
	# `go install k8s.io/kubernetes/cmd/...@v` is refused because
	# kubernetes' go.mod has replace directives (its staging modules live in
	# its own tree). A wrapper module that requires kubernetes and points
	# each staging module at its published version builds the same code.
	local gomod
	gomod=$(cd "$src" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[[ -f $gomod ]] || {
		log "cannot download k8s.io/kubernetes@$K8S_VERSION"
		exit 1
	}
	{
		echo "module nftredir.test/k8s-tools"
		echo
		echo "go 1.22.0"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#replace \1 => \1 '"$STAGING_VERSION"'#p' "$gomod"
	} >"$src/go.mod"
	grep -q '^replace k8s.io/client-go ' "$src/go.mod" || {
		log "no staging replace lines found in $gomod"
		exit 1
	}
	local cmds=(kube-apiserver kubelet kube-controller-manager kube-scheduler kubectl)
	local pkgs=()
	for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	(cd "$src" && go get "${pkgs[@]/%/@$K8S_VERSION}" >/dev/null 2>&1) ||
		(cd "$src" && go get "${pkgs[@]/%/@$K8S_VERSION}")
	# The version the binaries report (nodes, `kubectl version`, skew
	# checks) comes from ldflags in Kubernetes' own build.
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local ld="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	# One invocation: the packages the five binaries share compile once.
	(cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$BIN/" "${pkgs[@]}")
	for c in "${cmds[@]}"; do [[ -x $BIN/$c ]]; done
	touch "$stamp"
}

# containerd's own module has no replace directives, so `go install
# pkg@version` builds it (GOFLAGS cleared: it refuses a caller's -mod).
# Its Makefile's tags: no generated man pages, and the shim (one per pod)
# without the gRPC server it does not serve.
build_containerd() {
	local stamp="$BIN/.containerd-$CONTAINERD_VERSION"
	[[ -e $stamp ]] && return 0
	log "building containerd $CONTAINERD_VERSION, its runc shim and ctr"
	local mod=github.com/containerd/containerd/v2
	local ld="-s -w -X $mod/version.Version=$CONTAINERD_VERSION"
	GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS= go install -trimpath -ldflags "$ld" -tags urfave_cli_no_docs \
		"$mod/cmd/containerd@$CONTAINERD_VERSION" "$mod/cmd/ctr@$CONTAINERD_VERSION"
	GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS= go install -trimpath -ldflags "$ld" -tags "urfave_cli_no_docs no_grpc" \
		"$mod/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
	for c in containerd containerd-shim-runc-v2 ctr; do [[ -x $BIN/$c ]]; done
	touch "$stamp"
}

# etcd's server module points its sibling modules at ../ with replace
# directives, which `go install pkg@version` refuses; a wrapper module
# that requires the published siblings at the same version builds the
# same code, as for Kubernetes.
build_etcd() {
	local stamp="$BIN/.etcd-$ETCD_VERSION"
	[[ -e $stamp ]] && return 0
	local src="$CACHE/etcd-src"
	rm -rf "$src"
	mkdir -p "$src"
	log "building etcd $ETCD_VERSION"
	local mods=(go.etcd.io/etcd/server/v3 go.etcd.io/etcd/api/v3 go.etcd.io/etcd/client/pkg/v3
		go.etcd.io/etcd/client/v3 go.etcd.io/etcd/pkg/v3)
	printf 'module nftredir.test/etcd-tools\n\ngo 1.24\n' >"$src/go.mod"
	(cd "$src" && GOFLAGS=-mod=mod go get "${mods[@]/%/@$ETCD_VERSION}" >/dev/null 2>&1) ||
		(cd "$src" && GOFLAGS=-mod=mod go get "${mods[@]/%/@$ETCD_VERSION}")
	(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
	[[ -x $BIN/etcd ]]
	touch "$stamp"
}

extract_debian() {
	local stamp="$BIN/.debian-${DEBIAN_PKGS[*]// /-}"
	stamp=${stamp// /-}
	[[ -e $stamp ]] && return 0
	log "extracting ${DEBIAN_PKGS[*]} from Debian packages"
	local tmp
	tmp=$(mktemp -d)
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	if ! (cd "$tmp" && apt-get download "${DEBIAN_PKGS[@]}" >/dev/null 2>&1); then
		apt-get update -qq
		(cd "$tmp" && apt-get download "${DEBIAN_PKGS[@]}" >/dev/null)
	fi
	for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
	install -m 0755 "$tmp/root/usr/sbin/runc" "$BIN/runc"
	touch "$stamp"
}

case "${1:-all}" in
all)
	extract_debian
	build_containerd
	build_etcd
	build_kube
	;;
debian) extract_debian ;;
containerd) build_containerd ;;
etcd) build_etcd ;;
kube) build_kube ;;
*)
	echo "usage: $0 [all|debian|containerd|etcd|kube]" >&2
	exit 2
	;;
esac
echo "$BIN"
