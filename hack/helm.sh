#!/usr/bin/env bash
# Builds and caches helm, at one pinned version, from the Go module proxy:
# the chart's tests (helm lint, helm template) and the cluster test's helm
# install run it. Cached outside the clone, like hack/k8s-tools.sh's
# binaries, so fresh clones (CI) reuse it:
#   ${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/helm-<version>/bin/helm
# A stamp file marks a complete build; an interrupted one is redone on the
# next run. Prints the binary's path on stdout when done.
set -euo pipefail

# Keep in step with internal/testkit/helmbin.Version (the tests find the binary by it).
HELM_VERSION=v3.22.0

CACHE="${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/helm-$HELM_VERSION"
BIN="$CACHE/bin"
mkdir -p "$BIN"

# Two clones building at once would race on the same file.
exec 9>"$CACHE/.lock"
flock 9

stamp="$BIN/.helm-$HELM_VERSION"
if [[ ! -e $stamp || ! -x $BIN/helm ]]; then
	echo "helm: building helm $HELM_VERSION (first time on this machine: a few minutes)" >&2
	# helm's own build (its Makefile) stamps its version, and the
	# Kubernetes version that `helm template` and `helm lint` assume
	# (.Capabilities.KubeVersion, kubeVersion checks: 1.<minor of its
	# client-go>), with ldflags; without them helm says "v3.22" and
	# assumes Kubernetes 1.20. Set them as upstream does.
	gomod=$(GOFLAGS=-mod=mod go mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	minor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod")
	[[ -n $minor ]] || {
		echo "helm: no k8s.io/client-go in $gomod" >&2
		exit 1
	}
	ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
	for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
	done
	CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	touch "$stamp"
fi
echo "$BIN/helm"
