#!/usr/bin/env bash
# make test's runner: every test, make race and a short make fuzz.
#
# On a first run most of the CPU goes to building the cluster suites'
# tools (hack/k8s-tools.sh, hack/helm.sh, hack/istio-tools.sh) and the
# image's cross-compiled binaries, while the tests spend much of their time
# waiting on the kernel, sockets, timers and the cluster. So the builds run
# in the background, in the order the tests need them, and each group of
# tests runs once its tools are there:
#
#   1. no tools: every package but the ones below, and the e2e tests that
#      run no cluster;
#   2. Kubernetes, helm and the image: the cluster suite (e2e's TestK8s*
#      and TestImage*), the chart's tests (deploy) and kcluster's own;
#   3. istiod and istio-cni: the Istio suite (TestIstio*), istiotest's own
#      and the bench's quick run (its pod start runs istiod).
#
# make race and make fuzz, which are CPU-bound, run beside group 2, which
# mostly waits on the cluster; their output follows group 2's. Where the
# tools are cached every wait ends at once.
#
# Run through make test (it sets GO, CI_FUZZTIME and the build
# configuration the Makefile exports).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}

cluster_pkgs=(./deploy ./internal/testkit/kcluster)
cluster_tests='^Test(K8s|Image)'
istio_pkgs=(./cmd/nftredir-bench ./internal/testkit/istiotest)
istio_tests='^TestIstio'

work=$(mktemp -d)
pids=()
# Each background job in a process group of its own, so a failure here
# stops its builds too.
background() { # name command...
	local name=$1
	shift
	set -m
	"$@" >"$work/$name.log" 2>&1 &
	pids+=($!)
	set +m
}
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# await NAME PID: wait for a background job; print its log, and fail
# with it when it failed.
await() {
	local start=$SECONDS status=0
	wait "$2" || status=$?
	if ((status != 0)); then
		echo "$1 failed:" >&2
		cat "$work/$1.log" >&2
		exit 1
	fi
	sed "s/^/$1: /" "$work/$1.log"
	echo "$1: waited $((SECONDS - start)) s for it"
}

cluster_tools() {
	local start=$SECONDS
	hack/k8s-tools.sh >/dev/null
	hack/helm.sh >/dev/null
	# The e2e suite builds the image (hack/image.sh) for every platform;
	# compiling it here leaves its link alone on the suite's clock.
	hack/image.sh "$work/image.tar" nftredir:prebuild "$work/image-bin" >/dev/null
	rm -rf "$work/image.tar" "$work/image-bin"
	echo "Kubernetes, helm and the image's binaries ready in $((SECONDS - start)) s"
}
istio_tools() {
	local start=$SECONDS
	hack/istio-tools.sh >/dev/null
	echo "istiod and istio-cni ready in $((SECONDS - start)) s"
}
background cluster-tools cluster_tools
cluster_pid=${pids[-1]}
background istio-tools istio_tools
istio_pid=${pids[-1]}

mapfile -t tool_pkgs < <($GO list ./e2e "${cluster_pkgs[@]}" "${istio_pkgs[@]}")
mapfile -t plain_pkgs < <($GO list ./... | grep -vxF -f <(printf '%s\n' "${tool_pkgs[@]}"))

echo "== tests that need no cluster tools"
$GO test -p 1 -count=1 -timeout 30m "${plain_pkgs[@]}"
$GO test -p 1 -count=1 -timeout 30m -skip "$cluster_tests|$istio_tests" ./e2e

await cluster-tools "$cluster_pid"
background race-fuzz sh -c "$MAKE --no-print-directory race && $MAKE --no-print-directory fuzz FUZZTIME=${CI_FUZZTIME:-50000x}"
race_pid=${pids[-1]}
echo "== the Kubernetes cluster suite and the chart's tests (make race and make fuzz beside them)"
$GO test -p 1 -count=1 -timeout 30m "${cluster_pkgs[@]}"
$GO test -p 1 -count=1 -timeout 30m -run "$cluster_tests" ./e2e
echo "== make race and make fuzz"
await race-fuzz "$race_pid"

await istio-tools "$istio_pid"
echo "== the Istio suite"
$GO test -p 1 -count=1 -timeout 30m "${istio_pkgs[@]}"
$GO test -p 1 -count=1 -timeout 30m -run "$istio_tests" ./e2e
