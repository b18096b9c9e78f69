package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFlagDefaults(t *testing.T) {
	o, err := parseFlags(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := nft.DefaultSpec("flags")
	if !equalSpec(o.spec, want) {
		t.Errorf("default spec %+v, want %+v", o.spec, want)
	}
	if o.socket != defaults.Socket || o.stateDir != defaults.StateDir || o.reconcileInterval != 30*time.Second || !o.reflection {
		t.Errorf("defaults: %+v", o)
	}
	if o.routing != netns.DefaultRouting() {
		t.Errorf("routing: %+v", o.routing)
	}
}

// TestKubernetesStateDirDeprecated: the flag that named the Kubernetes
// agent's own directory now names where an older daemon kept it, to be
// moved under --state-dir. Left out, that is the old default, without a
// word; given, it is accepted with a warning, unless empty (nothing to
// move); one that holds the state directory, or lies in it, is refused
// before anything moves.
func TestKubernetesStateDirDeprecated(t *testing.T) {
	k8s := []string{"--kubernetes", "--node-name", "n1"}
	o, err := parseFlags(k8s, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.kubeStateDir != defaults.LegacyKubeStateDir || len(o.warnings) != 0 {
		t.Errorf("default: %q, warnings %q", o.kubeStateDir, o.warnings)
	}
	for _, args := range [][]string{
		{"--kubernetes-state-dir", "/var/lib/nftredir/seen"},
		{"--kubernetes-state-dir", "/run/nftredir/pods/seen"},
	} {
		o, err := parseFlags(append(args, k8s...), env(nil), io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if len(o.warnings) != 1 || !strings.Contains(o.warnings[0], "deprecated") {
			t.Errorf("%q: warnings %q", args, o.warnings)
		}
	}
	o, err = parseFlags(append([]string{"--kubernetes-state-dir="}, k8s...), env(nil), io.Discard)
	if err != nil || o.kubeStateDir != "" || len(o.warnings) != 0 {
		t.Errorf("empty: %v, %q, warnings %q", err, o.kubeStateDir, o.warnings)
	}
	o, err = parseFlags(k8s, env(map[string]string{"NFTREDIR_KUBERNETES_STATE_DIR": "/srv/seen"}), io.Discard)
	if err != nil || o.kubeStateDir != "/srv/seen" || len(o.warnings) != 1 {
		t.Errorf("env twin: %v, %+v", err, o)
	}
	for _, dir := range []string{"/run/nftredir", "/run/nftredir/pods", "/run/nftredir/pods/teardown", "seen"} {
		if _, err := parseFlags(append([]string{"--kubernetes-state-dir", dir}, k8s...), env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--kubernetes-state-dir") {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

func equalSpec(a, b nft.Spec) bool {
	return a.Mode == b.Mode && a.OutboundPort == b.OutboundPort && a.InboundPort == b.InboundPort &&
		a.InboundHBONEPort == b.InboundHBONEPort && a.DNSPort == b.DNSPort && a.ProxyMark == b.ProxyMark &&
		a.TProxyMark == b.TProxyMark && a.ProbeSourceV4 == b.ProbeSourceV4 && a.ProbeSourceV6 == b.ProbeSourceV6 &&
		a.TProxyAddrV4 == b.TProxyAddrV4 && a.TProxyAddrV6 == b.TProxyAddrV6 &&
		a.CaptureDNS == b.CaptureDNS && a.IPv6 == b.IPv6
}

func TestFlagTProxyTargets(t *testing.T) {
	o, err := parseFlags([]string{"--tproxy-ipv4", "10.0.0.1", "--tproxy-ipv6="}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.spec.TProxyAddrV4.String() != "10.0.0.1" || o.spec.TProxyAddrV6.IsValid() {
		t.Errorf("tproxy targets %v %v, want 10.0.0.1 and none", o.spec.TProxyAddrV4, o.spec.TProxyAddrV6)
	}
	for _, args := range [][]string{{"--tproxy-ipv4", "::1"}, {"--tproxy-ipv6", "127.0.0.1"}, {"--tproxy-ipv4", "224.0.0.1"}} {
		if _, err := parseFlags(args, env(nil), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestFlagWinsOverEnv(t *testing.T) {
	e := env(map[string]string{
		"NFTREDIR_LOG_LEVEL":       "debug",
		"NFTREDIR_ALLOW_UID":       "1000,1001",
		"NFTREDIR_OUTBOUND_PORT":   "16001",
		"NFTREDIR_CAPTURE_MODE":    "REDIRECT",
		"NFTREDIR_PROBE_SOURCE_V6": "", // set but empty: disables
	})
	o, err := parseFlags([]string{"--outbound-port", "17001", "--allow-uid=42"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.logLevel != "debug" || o.spec.Mode != nft.ModeRedirect {
		t.Errorf("env twins not applied: level %q mode %v", o.logLevel, o.spec.Mode)
	}
	if o.spec.OutboundPort != 17001 || !slices.Equal(o.allowUIDs, idList{42}) {
		t.Errorf("flags must win: port %d uids %v", o.spec.OutboundPort, o.allowUIDs)
	}
	if o.spec.ProbeSourceV6.IsValid() {
		t.Error("an empty NFTREDIR_PROBE_SOURCE_V6 must disable the v6 probe bypass")
	}
}

func TestZDSAllowlistFlags(t *testing.T) {
	o, err := parseFlags(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.zdsAllowUIDs) != 0 || len(o.zdsAllowGIDs) != 0 || o.zdsSocketGroup != 0 {
		t.Errorf("ZDS defaults uids %v gids %v group %d; want root only", o.zdsAllowUIDs, o.zdsAllowGIDs, o.zdsSocketGroup)
	}
	// The API's allowlist does not open ZDS, nor the reverse.
	o, err = parseFlags([]string{"--allow-uid=42", "--zds-allow-uid=1337", "--zds-allow-gid=7,8", "--zds-socket-group=7"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.allowUIDs, idList{42}) || !slices.Equal(o.zdsAllowUIDs, idList{1337}) || !slices.Equal(o.zdsAllowGIDs, idList{7, 8}) || o.zdsSocketGroup != 7 || len(o.allowGIDs) != 0 {
		t.Errorf("got api uids %v gids %v, zds uids %v gids %v group %d", o.allowUIDs, o.allowGIDs, o.zdsAllowUIDs, o.zdsAllowGIDs, o.zdsSocketGroup)
	}
}

func TestInvalidFlags(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--capture-mode", "NAT"}, nil, "capture mode"},
		{[]string{"--outbound-port", "0"}, nil, "not a port"},
		{[]string{"--inbound-port", fmt.Sprint(defaults.OutboundPort)}, nil, fmt.Sprint("both ", defaults.OutboundPort)},
		{[]string{"--proxy-mark", fmt.Sprintf("%#x/%#x", defaults.TProxyMark, defaults.MarkMask)}, nil, "indistinguishable"},
		{[]string{"--proxy-mark", "zz"}, nil, "mark/mask"},
		{[]string{"--route-table", "254"}, nil, "reserved"},
		{[]string{"--rule-priority", "40000"}, nil, "priority"},
		{[]string{"--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"--socket", "rel.sock"}, nil, "--socket"},
		{[]string{"--state-dir", "/a/../b"}, nil, "--state-dir"},
		{[]string{"--reconcile-interval", "0s"}, nil, "--reconcile-interval"},
		{[]string{"--allow-uid", "root"}, nil, "numeric"},
		{[]string{"--protect-netns", "relative/path"}, nil, "absolute"},
		{[]string{"--probe-source-v4", "fd00::1"}, nil, "IPv4"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{[]string{"uninstall", "uninstall"}, nil, "unexpected arguments"},
		{[]string{"--zds-socket", "run/z.sock"}, nil, "--zds-socket"},
		{[]string{"--zds-allow-uid", "ztunnel"}, nil, "numeric"},
		{[]string{"--zds-socket-group", "-1"}, nil, "--zds-socket-group"},
		{[]string{"--zds-socket", "/run/nftredir/nftredir.sock"}, nil, "both"},
		{[]string{"--zds-socket=", "--zds-require-ack"}, nil, "--zds-require-ack needs --zds-socket"},
		{[]string{"--node-netns", "netns/node"}, nil, "--node-netns"},
		{[]string{"--kubelet-uid", "kubelet"}, nil, "numeric"},
		{[]string{"--kubelet-uid", "4294967296"}, nil, "numeric"},
		{[]string{"--probe-snat", "--probe-source-v4=", "--probe-source-v6="}, nil, "--probe-snat needs a probe source"},
		{[]string{"--kubelet-uid", "0", "--probe-source-v4=", "--probe-source-v6="}, nil, "--probe-snat needs a probe source"},
		{nil, map[string]string{"NFTREDIR_HBONE_PORT": "x"}, "NFTREDIR_HBONE_PORT"},
		{[]string{"--enrolment", "nri"}, nil, "--enrolment nri is for Kubernetes mode"},
		{[]string{"--kubernetes", "--node-name", "n", "--enrolment", "exec"}, nil, "use cni, nri, auto"},
		{[]string{"--kubernetes", "--node-name", "n", "--enrolment", "nri", "--nri-socket", "nri.sock"}, nil, "--nri-socket"},
	}
	for _, tt := range tests {
		_, err := parseFlags(tt.args, env(tt.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v %v: error %v, want it to mention %q", tt.args, tt.env, err, tt.want)
		}
	}
}

func TestHelpDocumentsEnvTwins(t *testing.T) {
	var out strings.Builder
	_, err := parseFlags([]string{"--help"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"NFTREDIR_SOCKET", "NFTREDIR_ALLOW_GID", "--tproxy-mark", fmt.Sprintf("default %#x/%#x", defaults.TProxyMark, defaults.MarkMask), "wins over",
		"NFTREDIR_ZDS_SOCKET", "default /var/run/ztunnel/ztunnel.sock", "NFTREDIR_ZDS_REQUIRE_ACK", "NFTREDIR_PROBE_SNAT",
		"NFTREDIR_NODE_NETNS", "NFTREDIR_KUBELET_UID", "nftredird uninstall", "NFTREDIR_CLEANUP_ON_EXIT"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	if code := run([]string{"--bogus"}, env(nil), io.Discard); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
	if code := run([]string{"-h"}, env(nil), io.Discard); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

func TestProxyFlags(t *testing.T) {
	o, err := parseFlags(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.command != "" || o.zdsSocket != defaults.ZDSSocket || o.zdsRequireAck || o.probeSNAT || o.nodeNetns != "" || o.kubeletUID != 0 {
		t.Errorf("defaults: command %q zds %q require-ack %v probe-snat %v node-netns %q kubelet-uid %d",
			o.command, o.zdsSocket, o.zdsRequireAck, o.probeSNAT, o.nodeNetns, o.kubeletUID)
	}
	e := env(map[string]string{
		"NFTREDIR_ZDS_SOCKET":      "/run/z/ztunnel.sock",
		"NFTREDIR_ZDS_REQUIRE_ACK": "true",
		"NFTREDIR_PROBE_SNAT":      "false",
		"NFTREDIR_NODE_NETNS":      "/run/netns/node",
		"NFTREDIR_KUBELET_UID":     "4242",
	})
	o, err = parseFlags(nil, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.zdsSocket != "/run/z/ztunnel.sock" || !o.zdsRequireAck || o.probeSNAT || o.nodeNetns != "/run/netns/node" || o.kubeletUID != 4242 {
		t.Errorf("env twins: %+v", o)
	}
	// Empty turns ZDS off, and the probe table needs no source when off.
	o, err = parseFlags([]string{"--zds-socket=", "--probe-snat=false", "--probe-source-v4=", "--probe-source-v6="}, env(nil), io.Discard)
	if err != nil || o.zdsSocket != "" || o.probeSNAT {
		t.Errorf("ZDS and probe SNAT off: %+v, %v", o, err)
	}
}

func TestUninstallCommand(t *testing.T) {
	for _, args := range [][]string{
		{"uninstall", "--node-netns", "/run/netns/node"},
		{"--node-netns", "/run/netns/node", "uninstall"},
		{"--log-format", "text", "uninstall", "--node-netns=/run/netns/node"},
	} {
		o, err := parseFlags(args, env(nil), io.Discard)
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if o.command != cmdUninstall || o.nodeNetns != "/run/netns/node" {
			t.Errorf("%q: command %q node-netns %q", args, o.command, o.nodeNetns)
		}
	}
}

// TestProbeSNATOnlyWhenAsked: the node table is off by default, on with a
// kubelet uid (flag or env), and an explicit --probe-snat wins both ways.
func TestProbeSNATOnlyWhenAsked(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want bool
		uid  uint32
	}{
		{nil, nil, false, 0},
		{[]string{"--kubelet-uid", "0"}, nil, true, 0},
		{[]string{"--kubelet-uid=4242"}, nil, true, 4242},
		{nil, map[string]string{"NFTREDIR_KUBELET_UID": "0"}, true, 0},
		{[]string{"--probe-snat"}, nil, true, 0},
		{nil, map[string]string{"NFTREDIR_PROBE_SNAT": "true"}, true, 0},
		{[]string{"--kubelet-uid", "0", "--probe-snat=false"}, nil, false, 0},
		{[]string{"--kubelet-uid", "0"}, map[string]string{"NFTREDIR_PROBE_SNAT": "false"}, false, 0},
		{[]string{"uninstall"}, nil, false, 0},
	} {
		o, err := parseFlags(tt.args, env(tt.env), io.Discard)
		if err != nil {
			t.Errorf("%v %v: %v", tt.args, tt.env, err)
			continue
		}
		if o.probeSNAT != tt.want || uint32(o.kubeletUID) != tt.uid {
			t.Errorf("%v %v: probe-snat %v kubelet-uid %d, want %v %d", tt.args, tt.env, o.probeSNAT, o.kubeletUID, tt.want, tt.uid)
		}
	}
}

// The readiness taint defaults to nftredir's key, takes Istio's, is
// disabled by an empty value and refuses what the API would; the pod's
// name and namespace come from the Downward API's variables, together.
func TestFlagReadinessTaintAndPod(t *testing.T) {
	base := map[string]string{"NODE_NAME": "n1", "NFTREDIR_KUBERNETES": "true"}
	with := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return env(m)
	}
	o, err := parseFlags(nil, with("POD_NAME", "nftredir-x", "POD_NAMESPACE", "nftredir-system"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.readinessTaint != "nftredir.io/agent-not-ready" || o.podName != "nftredir-x" || o.podNamespace != "nftredir-system" || !o.uninstallReleasePods {
		t.Errorf("defaults: taint %q pod %s/%s release %v", o.readinessTaint, o.podNamespace, o.podName, o.uninstallReleasePods)
	}
	o, err = parseFlags(nil, with("NFTREDIR_READINESS_TAINT", "cni.istio.io/not-ready", "NFTREDIR_UNINSTALL_RELEASE_PODS", "false"), io.Discard)
	if err != nil || o.readinessTaint != "cni.istio.io/not-ready" || o.uninstallReleasePods {
		t.Errorf("env twins: %v %+v", err, o)
	}
	if o, err := parseFlags([]string{"--readiness-taint="}, with(), io.Discard); err != nil || o.readinessTaint != "" {
		t.Errorf("empty taint: %v", err)
	}
	for _, bad := range [][]string{{"--readiness-taint", "not a key"}, {"--pod-name", "only-name"}} {
		if _, err := parseFlags(bad, with(), io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestTakeOverDefaultsToKubernetesMode: foreign capture is taken over by
// default in Kubernetes mode only; the flag or its variable decide
// otherwise.
func TestTakeOverDefaultsToKubernetesMode(t *testing.T) {
	kube := []string{"--kubernetes", "--node-name", "n1"}
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{nil, nil, false},
		{kube, nil, true},
		{append(kube[:3:3], "--take-over-foreign-capture=false"), nil, false},
		{kube, map[string]string{"NFTREDIR_TAKE_OVER_FOREIGN_CAPTURE": "false"}, false},
		{[]string{"--take-over-foreign-capture"}, nil, true},
		{nil, map[string]string{"NFTREDIR_TAKE_OVER_FOREIGN_CAPTURE": "true"}, true},
	} {
		o, err := parseFlags(tt.args, env(tt.env), io.Discard)
		if err != nil {
			t.Errorf("%v %v: %v", tt.args, tt.env, err)
			continue
		}
		if o.takeOver != tt.want {
			t.Errorf("%v %v: take-over %v, want %v", tt.args, tt.env, o.takeOver, tt.want)
		}
	}
}

// TestDNSCaptureDefaultFollowsMode: DNS capture is on by default in
// Kubernetes mode (Istio's default), off standalone, and the flag or its
// variable sets it either way.
func TestDNSCaptureDefaultFollowsMode(t *testing.T) {
	kube := []string{"--kubernetes", "--node-name", "node-1"}
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{nil, nil, defaults.CaptureDNS},
		{kube, nil, defaults.KubernetesCaptureDNS},
		{append(slices.Clone(kube), "--dns-capture=false"), nil, false},
		{kube, map[string]string{"NFTREDIR_DNS_CAPTURE": "false"}, false},
		{nil, map[string]string{"NFTREDIR_KUBERNETES": "true", "NODE_NAME": "node-1"}, true},
		{[]string{"--dns-capture"}, nil, true},
	} {
		o, err := parseFlags(tt.args, env(tt.env), io.Discard)
		if err != nil {
			t.Errorf("%v %v: %v", tt.args, tt.env, err)
			continue
		}
		if o.dnsCapture != tt.want || o.spec.CaptureDNS != tt.want {
			t.Errorf("%v %v: dns capture %v (spec %v), want %v", tt.args, tt.env, o.dnsCapture, o.spec.CaptureDNS, tt.want)
		}
	}
	if defaults.CaptureDNS || !defaults.KubernetesCaptureDNS {
		t.Error("the defaults moved: standalone off, Kubernetes on, as the README says")
	}
}

// The enrolment door is one setting, NFTREDIR_ENROLMENT, which the chart's
// ConfigMap gives both containers.
func TestEnrolmentFlag(t *testing.T) {
	k8s := []string{"--kubernetes", "--node-name", "node-1"}
	o, err := parseFlags(k8s, env(nil), io.Discard)
	if err != nil || o.enrolment != defaults.Enrolment || o.nriSocket != defaults.NRISocket {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	o, err = parseFlags(k8s, env(map[string]string{"NFTREDIR_ENROLMENT": "auto", "NFTREDIR_NRI_SOCKET": "/run/nri/nri.sock"}), io.Discard)
	if err != nil || o.enrolment != defaults.EnrolmentAuto || o.nriSocket != "/run/nri/nri.sock" {
		t.Fatalf("from the environment: %+v %v", o, err)
	}
}
