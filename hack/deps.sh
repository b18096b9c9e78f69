#!/usr/bin/env bash
# Installs what the tests, the demo and the benchmark need when it is
# missing: Debian packages (nft, ip, iptables are used by tests to set up
# and observe; the product never runs them; systemd-analyze checks the
# unit) and pinned Go tools in ./bin.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="$PWD/bin"
GRPCURL_VERSION=v1.9.3
CNITOOL_VERSION=v1.3.0
CNI_PLUGINS_VERSION=v1.9.0

need_pkgs=()
command -v nft >/dev/null || need_pkgs+=(nftables)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v iptables-restore >/dev/null || need_pkgs+=(iptables)
command -v jq >/dev/null || need_pkgs+=(jq)
# systemd-analyze verifies deploy/systemd/nftredird.service in the tests.
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
if ((${#need_pkgs[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "deps: need ${need_pkgs[*]}; run as root or install them" >&2
		exit 1
	fi
	echo "deps: installing ${need_pkgs[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Go tools are installed by version into ./bin; a stamp file per version
# makes a version bump reinstall.
install_tool() { # name module version
	local stamp="$BIN/.$1-$3"
	[[ -x "$BIN/$1" && -e "$stamp" ]] && return 0
	echo "deps: installing $1 $3"
	GOBIN="$BIN" go install "$2@$3"
	touch "$stamp"
}
mkdir -p "$BIN"
install_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION"
if [[ "${NFTREDIR_DEPS_CNI:-1}" == 1 ]]; then
	install_tool cnitool github.com/containernetworking/cni/cnitool "$CNITOOL_VERSION"
	for p in bridge host-local loopback; do
		case $p in
		bridge) mod=main/bridge ;;
		host-local) mod=ipam/host-local ;;
		loopback) mod=main/loopback ;;
		esac
		install_tool "$p" "github.com/containernetworking/plugins/plugins/$mod" "$CNI_PLUGINS_VERSION"
	done
fi
# The Kubernetes cluster tests' binaries (kube-apiserver, kubelet, ...,
# etcd, containerd, runc), built once per machine into a cache outside the
# clone; the first build takes several minutes. See hack/k8s-tools.sh.
if [[ "${NFTREDIR_DEPS_K8S:-0}" == 1 ]]; then
	hack/k8s-tools.sh >/dev/null
fi
# The Istio suite's peers (istiod, istio-cni and Istio's CRDs), built once
# per machine from one pinned istio.io/istio version into the same cache.
# ztunnel is not among them: the tests take it from ZTUNNEL_BIN. See
# hack/istio-tools.sh.
if [[ "${NFTREDIR_DEPS_ISTIO:-0}" == 1 ]]; then
	hack/istio-tools.sh >/dev/null
fi
