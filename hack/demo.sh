#!/usr/bin/env bash
# make demo: two namespaces, a stand-in proxy, the real daemon, real TCP.
# Everything it creates carries this run's id and is removed on exit, also
# on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/bin"

if [[ $(id -u) -ne 0 ]]; then
	echo "make demo needs root: it creates network namespaces and programs nftables" >&2
	exit 1
fi

RUN_ID=$$
POD=nftr-demo-pod-$RUN_ID
CLIENT=nftr-demo-client-$RUN_ID
WORK=$(mktemp -d /tmp/nftredir-demo.XXXXXX)
SOCK=$WORK/run/nftredir.sock
PIDS=()

cleanup() {
	set +e
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	ip netns del "$POD" 2>/dev/null
	ip netns del "$CLIENT" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

bold=$'\e[1m'; dim=$'\e[2m'; reset=$'\e[0m'
[[ -t 1 ]] || { bold=; dim=; reset=; }
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$reset"; }
show() { printf '%s$ %s%s\n' "$dim" "$*" "$reset"; "$@"; }
in_pod() { ip netns exec "$POD" "$@"; }
in_client() { ip netns exec "$CLIENT" "$@"; }
ctl() { "$BIN/nftredirctl" --socket "$SOCK" "$@"; }

step "1. A pod and a client namespace, joined by a veth pair"
ip netns add "$POD"
ip netns add "$CLIENT"
ip -n "$POD" link set lo up
ip -n "$CLIENT" link set lo up
ip link add "nd$RUN_ID" netns "$CLIENT" type veth peer name eth0 netns "$POD"
ip -n "$POD" addr add 10.77.0.2/24 dev eth0
ip -n "$POD" addr add fd00:77::2/64 dev eth0 nodad
ip -n "$POD" link set eth0 up
ip -n "$CLIENT" addr add 10.77.0.1/24 dev "nd$RUN_ID"
ip -n "$CLIENT" addr add fd00:77::1/64 dev "nd$RUN_ID" nodad
ip -n "$CLIENT" link set "nd$RUN_ID" up
echo "pod    $POD    10.77.0.2  fd00:77::2"
echo "client $CLIENT 10.77.0.1  fd00:77::1"

step "2. In the pod: an app on :8080 and a stand-in node proxy on :15001 :15006 :15008"
# Started with ip netns exec directly (not through a shell function) so
# that $! is the process itself and cleanup can stop it.
ip netns exec "$POD" "$BIN/standin" app -port 8080 -name "the app" >/dev/null &
PIDS+=($!)
ip netns exec "$POD" "$BIN/standin" proxy >"$WORK/proxy.log" &
PIDS+=($!)
ip netns exec "$CLIENT" "$BIN/standin" app -port 9090 -name "a server outside the pod" >/dev/null &
PIDS+=($!)
sleep 0.3

step "3. Before enrolment, traffic is direct"
show in_client "$BIN/standin" dial 10.77.0.2:8080
show in_pod "$BIN/standin" dial 10.77.0.1:9090

step "4. Start nftredird (logs in $WORK/nftredird.log)"
"$BIN/nftredird" --socket "$SOCK" --state-dir "$WORK/state" --log-format text \
	--probe-snat=false --metrics-address 127.0.0.1:0 --zds-socket "$WORK/ztunnel/ztunnel.sock" >"$WORK/nftredird.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do ctl health >/dev/null 2>&1 && break; sleep 0.1; done
show ctl health

step "5. Enrol the pod through the gRPC API"
show ctl add --pod-uid demo-0001 --name web --namespace demo --netns "/run/netns/$POD" --ip 10.77.0.2 --ip fd00:77::2

step "6. Inbound: the client's connections to the pod land on the proxy, original destination intact"
show in_client "$BIN/standin" dial 10.77.0.2:8080
show in_client "$BIN/standin" dial "[fd00:77::2]:8080"
show in_client "$BIN/standin" dial 10.77.0.2:15008

step "7. Outbound: the pod's connection to the server is captured on :15001"
show in_pod "$BIN/standin" dial 10.77.0.1:9090
echo "and a socket carrying the proxy mark 0x539 goes out untouched:"
show in_pod "$BIN/standin" dial -mark 0x539 10.77.0.1:9090

step "8. What the daemon knows and what is in the pod's kernel"
show ctl list
show ctl get demo-0001

step "9. Remove the pod"
show ctl remove demo-0001
echo "nftables in the pod now (empty):"
show in_pod nft list ruleset

step "10. Traffic is direct again"
show in_client "$BIN/standin" dial 10.77.0.2:8080
show in_pod "$BIN/standin" dial 10.77.0.1:9090

step "Done: cleaning up namespaces, processes and $WORK"
