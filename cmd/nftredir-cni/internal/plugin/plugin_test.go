package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/client/clienttest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// prevResults are what a bridge plugin with host-local prints, in each
// supported version: the container's eth0 (index 2) has the pod's
// addresses, and the bridge (index 0) its gateway address, which is not
// the pod's. The 1.1.0 one uses a route field that only 1.1 has.
var prevResults = map[string]string{
	"0.4.0": `{
		"cniVersion": "0.4.0",
		"interfaces": [
			{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
			{"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
			{"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/pod1"}
		],
		"ips": [
			{"version": "4", "interface": 2, "address": "10.22.0.5/24", "gateway": "10.22.0.1"},
			{"version": "6", "interface": 2, "address": "fd00:22::5/64", "gateway": "fd00:22::1"},
			{"version": "4", "interface": 0, "address": "10.22.0.1/24"}
		],
		"routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
		"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
	}`,
	"1.0.0": `{
		"cniVersion": "1.0.0",
		"interfaces": [
			{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
			{"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
			{"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/pod1"}
		],
		"ips": [
			{"interface": 2, "address": "10.22.0.5/24", "gateway": "10.22.0.1"},
			{"interface": 2, "address": "fd00:22::5/64", "gateway": "fd00:22::1"},
			{"interface": 0, "address": "10.22.0.1/24"}
		],
		"routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
		"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
	}`,
	"1.1.0": `{
		"cniVersion": "1.1.0",
		"interfaces": [
			{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
			{"name": "veth1234", "mac": "aa:bb:cc:00:00:02", "mtu": 1450},
			{"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/pod1"}
		],
		"ips": [
			{"interface": 2, "address": "10.22.0.5/24", "gateway": "10.22.0.1"},
			{"interface": 2, "address": "fd00:22::5/64", "gateway": "fd00:22::1"},
			{"interface": 0, "address": "10.22.0.1/24"}
		],
		"routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1", "mtu": 1400, "table": 100}],
		"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
	}`,
}

const k8sArgs1 = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;K8S_POD_INFRA_CONTAINER_ID=ctr1;K8S_POD_UID=uid-1"

// env is a fake daemon on a real socket, a data dir and a plugin writing
// to buffers.
type env struct {
	fake            *clienttest.Fake
	srv             *clienttest.Server
	socket, dataDir string
	p               *Plugin
	stdout, stderr  *bytes.Buffer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{fake: clienttest.New(), dataDir: t.TempDir(), stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	e.srv = clienttest.Start(t, e.fake)
	e.socket = e.srv.Socket
	e.p = &Plugin{Stdout: e.stdout, Stderr: e.stderr}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", e.stderr)
		}
	})
	return e
}

// stop stops the daemon and waits until its socket is gone: a server
// stopped right after it started removes the socket only once its serving
// goroutine runs.
func (e *env) stop(t *testing.T) {
	t.Helper()
	e.srv.Stop()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(e.socket); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s still there 5s after the fake daemon stopped", e.socket)
		}
	}
}

// conf is a network config for the plugin, with the previous result when
// prev is set.
func (e *env) conf(t *testing.T, cniVersion, prev string, extra map[string]any) []byte {
	t.Helper()
	c := map[string]any{
		"cniVersion": cniVersion,
		"name":       "net",
		"type":       "nftredir-cni",
		"socket":     e.socket,
		"dataDir":    e.dataDir,
		"timeout":    "3s",
	}
	if prev != "" {
		c["prevResult"] = json.RawMessage(prev)
	}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func args(conf []byte, containerID, netns, cniArgs string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: containerID, Netns: netns, IfName: "eth0", Args: cniArgs, Path: "/opt/cni/bin", StdinData: conf}
}

// add runs ADD and requires success.
func (e *env) add(t *testing.T, a *skel.CmdArgs) {
	t.Helper()
	e.stdout.Reset()
	if err := e.p.Add(a); err != nil {
		t.Fatalf("ADD: %v", err)
	}
}

func jsonValue(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

// The result printed is the previous plugin's, in the config's version,
// unchanged: compared as JSON values with what the bridge printed.
func TestCNIAddPassesResultThrough(t *testing.T) {
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			e.add(t, args(e.conf(t, ver, prevResults[ver], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
			if diff := cmp.Diff(jsonValue(t, prevResults[ver]), jsonValue(t, e.stdout.String())); diff != "" {
				t.Errorf("printed result differs from prevResult (-prev +printed):\n%s", diff)
			}
		})
	}
}

// A prevResult of an older version is printed converted to the config's.
func TestCNIAddConvertsResultToConfigVersion(t *testing.T) {
	e := newEnv(t)
	e.add(t, args(e.conf(t, "1.1.0", prevResults["1.0.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	want := jsonValue(t, prevResults["1.0.0"]).(map[string]any)
	want["cniVersion"] = "1.1.0"
	if diff := cmp.Diff(want, jsonValue(t, e.stdout.String())); diff != "" {
		t.Errorf("(-want +printed):\n%s", diff)
	}
}

func TestCNIAddEnrolsPod(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], map[string]any{
		"captureMode":              "REDIRECT",
		"excludeInboundPorts":      []int{15021},
		"dnsCapture":               false,
		"rerouteVirtualInterfaces": []string{"k6t-eth0"},
	})
	e.add(t, args(conf, "ctr1", "/run/netns/pod1", k8sArgs1))
	reqs := e.fake.Requests()
	if len(reqs) != 1 {
		t.Fatalf("daemon got %d requests, want one AddPod: %v", len(reqs), reqs)
	}
	dns := false
	want := &nftredirv1.AddPodRequest{
		PodUid:       "uid-1",
		PodName:      "cart-0",
		PodNamespace: "shop",
		NetnsPath:    "/run/netns/pod1",
		PodIps:       []string{"10.22.0.5", "fd00:22::5"},
		Options: &nftredirv1.RedirectOptions{
			CaptureMode:              nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
			ExcludeInboundPorts:      []uint32{15021},
			DnsCapture:               &dns,
			RerouteVirtualInterfaces: []string{"k6t-eth0"},
		},
	}
	if diff := cmp.Diff(want, reqs[0], protocmp.Transform()); diff != "" {
		t.Errorf("AddPod request (-want +got):\n%s", diff)
	}
	att, err := attachments{e.dataDir}.Get("net", "ctr1", "eth0")
	if err != nil || att == nil {
		t.Fatalf("attachment record: %v, %v", att, err)
	}
	if att.PodUID != "uid-1" || att.KeySource != KeyPodUID || att.Netns != "/run/netns/pod1" {
		t.Errorf("attachment record %+v", att)
	}
}

// Without K8S_POD_UID the container id is the key, and DEL finds the pod
// under it.
func TestCNIContainerIDKey(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	e.add(t, args(conf, "ctr7", "/run/netns/pod7", ""))
	if e.fake.Pod("ctr7") == nil {
		t.Fatal("pod not enrolled under its container id")
	}
	if err := e.p.Del(args(conf, "ctr7", "/run/netns/pod7", "")); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("ctr7") != nil {
		t.Fatal("DEL left the pod enrolled")
	}
}

func TestCNIAddWithoutPrevResult(t *testing.T) {
	e := newEnv(t)
	err := e.p.Add(args(e.conf(t, "1.0.0", "", nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	ce := asCNI(t, err)
	if ce.Code != types.ErrInvalidNetworkConfig || !strings.Contains(ce.Msg, "must be chained after a plugin that assigns IPs") {
		t.Errorf("got %d %q", ce.Code, ce.Msg)
	}
	e.assertNothingDone(t)
}

func TestCNIAddExcludedNamespace(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], map[string]any{"excludeNamespaces": []string{"kube-system", "shop"}})
	e.add(t, args(conf, "ctr1", "/run/netns/pod1", k8sArgs1))
	if diff := cmp.Diff(jsonValue(t, prevResults["1.0.0"]), jsonValue(t, e.stdout.String())); diff != "" {
		t.Errorf("excluded pod's result changed:\n%s", diff)
	}
	if n := len(e.fake.Requests()); n != 0 {
		t.Errorf("the daemon was called %d times for an excluded namespace", n)
	}
	// DEL and CHECK of it do not ask the daemon either.
	if err := e.p.Check(args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := e.p.Del(args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)); err != nil {
		t.Errorf("DEL: %v", err)
	}
	if n := len(e.fake.Requests()); n != 0 {
		t.Errorf("the daemon was called %d times for an excluded namespace", n)
	}
}

func TestCNIAddDaemonUnreachable(t *testing.T) {
	e := newEnv(t)
	e.stop(t)
	err := e.p.Add(args(e.conf(t, "1.0.0", prevResults["1.0.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	ce := asCNI(t, err)
	if ce.Code != 11 || !strings.Contains(ce.Msg, e.socket) || !strings.Contains(ce.Msg, "does not exist") {
		t.Errorf("got %d %q; want code 11 naming the missing socket", ce.Code, ce.Msg)
	}
	e.assertNothingDone(t)
}

// Every refusal of the daemon fails ADD with a code a runtime can act on,
// prints nothing, and keeps the attachment record only when the daemon may
// have applied the pod after all.
func TestCNIAddErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		code       codes.Code
		cni        uint
		keepRecord bool
	}{
		{codes.Unavailable, 11, false},
		{codes.DeadlineExceeded, 11, true},
		{codes.ResourceExhausted, 11, false},
		{codes.InvalidArgument, 7, false},
		{codes.FailedPrecondition, 8, false},
		{codes.PermissionDenied, 100, false},
		{codes.Unauthenticated, 100, false},
		{codes.Internal, 999, false},
		{codes.Unknown, 999, true},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			e := newEnv(t)
			// Enough failures to outlast the client's retries.
			e.fake.Fail("AddPod", slices.Repeat([]error{status.Error(tc.code, "the daemon says no")}, 10)...)
			err := e.p.Add(args(e.conf(t, "1.0.0", prevResults["1.0.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
			ce := asCNI(t, err)
			if ce.Code != tc.cni || !strings.Contains(ce.Msg, "the daemon says no") || !strings.Contains(ce.Msg, "uid-1") {
				t.Errorf("got %d %q; want code %d with the daemon's message and the pod", ce.Code, ce.Msg, tc.cni)
			}
			if e.stdout.Len() != 0 {
				t.Errorf("failed ADD printed %q", e.stdout)
			}
			att, _ := attachments{e.dataDir}.Get("net", "ctr1", "eth0")
			if (att != nil) != tc.keepRecord {
				t.Errorf("attachment record kept = %v, want %v", att != nil, tc.keepRecord)
			}
		})
	}
}

func (e *env) assertNothingDone(t *testing.T) {
	t.Helper()
	if e.stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", e.stdout)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Error("pod enrolled")
	}
	if files, _ := filepath.Glob(filepath.Join(e.dataDir, "*", "*")); len(files) != 0 {
		t.Errorf("attachment records left: %v", files)
	}
}

func TestCNIDel(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	a := args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)
	e.add(t, a)
	for i := range 2 {
		if err := e.p.Del(a); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	e.stdout.Reset()
	e.assertNothingDone(t)
}

// removeRequests are the RemovePod requests the daemon got.
func (e *env) removeRequests() []*nftredirv1.RemovePodRequest {
	var out []*nftredirv1.RemovePodRequest
	for _, r := range e.fake.Requests() {
		if rm, ok := r.(*nftredirv1.RemovePodRequest); ok {
			out = append(out, rm)
		}
	}
	return out
}

// DEL is one RemovePod, released only if the pod is still enrolled with
// the namespace this attachment enrolled, with the hint that the runtime
// deletes that namespace next; it does not ask ListPods first.
func TestCNIDelIsOneConditionalRemovePod(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	a := args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)
	e.add(t, a)
	if err := e.p.Del(a); err != nil {
		t.Fatal(err)
	}
	want := []*nftredirv1.RemovePodRequest{{PodUid: "uid-1", NetnsPath: "/run/netns/pod1", NamespaceTeardown: true}}
	if diff := cmp.Diff(want, e.removeRequests(), protocmp.Transform()); diff != "" {
		t.Errorf("RemovePod requests (-want +got):\n%s", diff)
	}
	if n := e.fake.Calls("ListPods") + e.fake.Calls("GetPod"); n != 0 {
		t.Errorf("DEL asked the daemon for pods %d times, want none", n)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Error("DEL left the pod enrolled")
	}
}

// DEL finds the pod under the key ADD used even when the runtime passes
// no CNI_ARGS, and without a namespace (it is gone): the record names the
// namespace the release is conditional on.
func TestCNIDelUsesAttachmentRecord(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	e.add(t, args(conf, "ctr1", "/run/netns/pod1", k8sArgs1))
	if err := e.p.Del(args(conf, "ctr1", "", "")); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Fatal("pod still enrolled")
	}
	want := []*nftredirv1.RemovePodRequest{{PodUid: "uid-1", NetnsPath: "/run/netns/pod1", NamespaceTeardown: true}}
	if diff := cmp.Diff(want, e.removeRequests(), protocmp.Transform()); diff != "" {
		t.Errorf("RemovePod requests (-want +got):\n%s", diff)
	}
}

func TestCNIDelSucceedsWithoutDaemon(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	a := args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)
	e.add(t, a)
	e.stop(t)
	if err := e.p.Del(a); err != nil {
		t.Fatalf("DEL without daemon: %v", err)
	}
	// The runtime forgets the attachment, so the record must go too; the
	// daemon drops the pod itself once its namespace is gone.
	if att, _ := (attachments{e.dataDir}).Get("net", "ctr1", "eth0"); att != nil {
		t.Error("attachment record left after a successful DEL")
	}
}

func TestCNIDelErrors(t *testing.T) {
	for _, tc := range []struct {
		method string
		code   codes.Code
		fail   bool
	}{
		{"RemovePod", codes.Internal, true},
		{"RemovePod", codes.Unknown, true},
		{"RemovePod", codes.PermissionDenied, false},
		{"RemovePod", codes.InvalidArgument, false},
		{"RemovePod", codes.Unavailable, false},
		{"RemovePod", codes.DeadlineExceeded, false},
		{"RemovePod", codes.FailedPrecondition, false},
	} {
		t.Run(tc.method+"/"+tc.code.String(), func(t *testing.T) {
			e := newEnv(t)
			conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
			a := args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)
			e.add(t, a)
			e.fake.Fail(tc.method, slices.Repeat([]error{status.Error(tc.code, "no")}, 10)...)
			err := e.p.Del(a)
			if (err != nil) != tc.fail {
				t.Fatalf("DEL error = %v, want failure %v", err, tc.fail)
			}
			if tc.fail && asCNI(t, err).Code != 999 {
				t.Errorf("code %d, want 999", asCNI(t, err).Code)
			}
		})
	}
}

// A pod whose sandbox was re-created keeps its capture when the old
// sandbox's DEL arrives late.
func TestCNIDelLeavesNewerSandbox(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	old := args(conf, "ctr1", "/run/netns/old", k8sArgs1)
	e.add(t, old)
	e.add(t, args(conf, "ctr2", "/run/netns/new", strings.Replace(k8sArgs1, "ctr1", "ctr2", 1)))
	if err := e.p.Del(old); err != nil {
		t.Fatal(err)
	}
	if p := e.fake.Pod("uid-1"); p == nil || p.NetnsPath != "/run/netns/new" {
		t.Fatalf("DEL of the old sandbox released the new one: %v", p)
	}
	if log := e.stderr.String(); !strings.Contains(log, "pod enrolled with another namespace since; leaving it") || !strings.Contains(log, "/run/netns/new") {
		t.Errorf("log does not say the pod was left to its new namespace, with the daemon's message:\n%s", log)
	}
	if att, _ := (attachments{e.dataDir}).Get("net", "ctr1", "eth0"); att != nil {
		t.Error("the old attachment's record stayed after its successful DEL")
	}
	// The same holds when the new sandbox's record is lost: the namespace
	// the daemon has is not the one the old attachment enrolled.
	if err := (attachments{e.dataDir}).Delete("net", "ctr2", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.add(t, old)
	e.add(t, args(conf, "ctr2", "/run/netns/new", k8sArgs1))
	if err := (attachments{e.dataDir}).Delete("net", "ctr2", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Del(old); err != nil {
		t.Fatal(err)
	}
	if p := e.fake.Pod("uid-1"); p == nil {
		t.Fatal("DEL of the old sandbox released the new one")
	}
}

// A pod attached through two networks stays enrolled until both are
// deleted.
func TestCNIDelKeepsPodOfOtherAttachment(t *testing.T) {
	e := newEnv(t)
	confA := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	var m map[string]any
	json.Unmarshal(confA, &m)
	m["name"] = "net2"
	confB, _ := json.Marshal(m)
	a := args(confA, "ctr1", "/run/netns/pod1", k8sArgs1)
	b := args(confB, "ctr1", "/run/netns/pod1", k8sArgs1)
	b.IfName = "net1"
	e.add(t, a)
	e.add(t, b)
	if err := e.p.Del(b); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-1") == nil {
		t.Fatal("DEL of one attachment released the pod although another holds it")
	}
	if err := e.p.Del(a); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Fatal("DEL of the last attachment left the pod enrolled")
	}
}

func TestCNICheck(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	a := args(conf, "ctr1", "/run/netns/pod1", k8sArgs1)

	wantCode := func(t *testing.T, a *skel.CmdArgs, code uint, msg string) {
		t.Helper()
		ce := asCNI(t, e.p.Check(a))
		if ce.Code != code || !strings.Contains(ce.Msg, msg) {
			t.Errorf("CHECK: got %d %q; want %d containing %q", ce.Code, ce.Msg, code, msg)
		}
	}
	wantCode(t, a, ErrNotCaptured, "not enrolled")
	e.add(t, a)
	if err := e.p.Check(a); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	for _, tc := range []struct {
		st   nftredirv1.SyncStatus
		want string
	}{
		{nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED, "drifted"},
		{nftredirv1.SyncStatus_SYNC_STATUS_ABSENT, "absent"},
		{nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE, "gone"},
	} {
		e.fake.SetSync("uid-1", tc.st, "what the daemon saw", "")
		wantCode(t, a, ErrNotCaptured, tc.want)
		wantCode(t, a, ErrNotCaptured, "what the daemon saw")
	}
	e.fake.SetSync("uid-1", nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC, "", "")
	if err := e.p.Check(a); err != nil {
		t.Fatalf("CHECK in sync: %v", err)
	}

	other := args(conf, "ctr1", "/run/netns/elsewhere", k8sArgs1)
	wantCode(t, other, ErrNotCaptured, "enrolled with network namespace /run/netns/pod1")

	moved := strings.Replace(prevResults["1.0.0"], "10.22.0.5/24", "10.22.0.6/24", 1)
	wantCode(t, args(e.conf(t, "1.0.0", moved, nil), "ctr1", "/run/netns/pod1", k8sArgs1), ErrNotCaptured, "10.22.0.6")

	e.stop(t)
	wantCode(t, a, 11, e.socket)
}

func TestCNIStatus(t *testing.T) {
	e := newEnv(t)
	a := &skel.CmdArgs{StdinData: e.conf(t, "1.1.0", "", nil), Path: "/opt/cni/bin"}
	if err := e.p.Status(a); err != nil {
		t.Fatalf("STATUS of a serving daemon: %v", err)
	}
	e.fake.Health.SetServingStatus(client.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	if ce := asCNI(t, e.p.Status(a)); ce.Code != 50 || !strings.Contains(ce.Msg, "not serving") {
		t.Errorf("STATUS of a starting daemon: %d %q", ce.Code, ce.Msg)
	}
	e.stop(t)
	if ce := asCNI(t, e.p.Status(a)); ce.Code != 50 || !strings.Contains(ce.Msg, e.socket) {
		t.Errorf("STATUS without daemon: %d %q", ce.Code, ce.Msg)
	}
}

func TestCNIGC(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.1.0", prevResults["1.1.0"], nil)
	e.add(t, args(conf, "ctr1", "/run/netns/pod1", k8sArgs1))
	e.add(t, args(conf, "ctr2", "/run/netns/pod2", "K8S_POD_UID=uid-2"))
	e.add(t, args(conf, "ctr3", "/run/netns/pod3", ""))
	// Enrolled by someone else (a node proxy, an operator): never ours to
	// remove, whatever the runtime's list says.
	cl, err := client.Dial(t.Context(), e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.AddPod(context.Background(), &nftredirv1.AddPodRequest{PodUid: "foreign", NetnsPath: "/run/netns/foreign"}); err != nil {
		t.Fatal(err)
	}

	gc := func(t *testing.T, key string, valid ...types.GCAttachment) error {
		t.Helper()
		extra := map[string]any{}
		if key != "" {
			extra[key] = valid
		}
		return e.p.GC(&skel.CmdArgs{StdinData: e.conf(t, "1.1.0", "", extra), Path: "/opt/cni/bin"})
	}
	enrolled := func() []string {
		var uids []string
		for _, p := range []string{"uid-1", "uid-2", "ctr3", "foreign"} {
			if e.fake.Pod(p) != nil {
				uids = append(uids, p)
			}
		}
		return uids
	}

	if err := gc(t, keyValidAttachments, types.GCAttachment{ContainerID: "ctr1", IfName: "eth0"}, types.GCAttachment{ContainerID: "ctr3", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"uid-1", "ctr3", "foreign"}, enrolled()); diff != "" {
		t.Errorf("after GC keeping ctr1, ctr3 (-want +got):\n%s", diff)
	}
	// The older key works too; an empty list means every attachment of
	// this network is stale.
	if err := gc(t, keyValidAttachmentsOld, types.GCAttachment{ContainerID: "ctr3", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ctr3", "foreign"}, enrolled()); diff != "" {
		t.Errorf("after GC keeping ctr3 (-want +got):\n%s", diff)
	}
	// No list at all, as cnitool gc sends, means the same as an empty one.
	if err := gc(t, ""); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"foreign"}, enrolled()); diff != "" {
		t.Errorf("after GC keeping nothing (-want +got):\n%s", diff)
	}
	if files, _ := filepath.Glob(filepath.Join(e.dataDir, "*", "*")); len(files) != 0 {
		t.Errorf("attachment records left: %v", files)
	}
}

// GC of one network leaves the pods of another alone.
func TestCNIGCOtherNetwork(t *testing.T) {
	e := newEnv(t)
	e.add(t, args(e.conf(t, "1.1.0", prevResults["1.1.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	conf := e.conf(t, "1.1.0", "", map[string]any{"name": "other", keyValidAttachments: []any{}})
	if err := e.p.GC(&skel.CmdArgs{StdinData: conf, Path: "/opt/cni/bin"}); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-1") == nil {
		t.Fatal("GC of network other released a pod of network net")
	}
}

// GC releases a stale attachment's pod only in the namespace the
// attachment enrolled, and without the teardown hint: nobody deletes a
// stale sandbox's namespace next, so its capture must go now.
func TestCNIGCRemovePodIsConditional(t *testing.T) {
	e := newEnv(t)
	e.add(t, args(e.conf(t, "1.1.0", prevResults["1.1.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	conf := e.conf(t, "1.1.0", "", map[string]any{keyValidAttachments: []any{}})
	if err := e.p.GC(&skel.CmdArgs{StdinData: conf, Path: "/opt/cni/bin"}); err != nil {
		t.Fatal(err)
	}
	want := []*nftredirv1.RemovePodRequest{{PodUid: "uid-1", NetnsPath: "/run/netns/pod1"}}
	if diff := cmp.Diff(want, e.removeRequests(), protocmp.Transform()); diff != "" {
		t.Errorf("RemovePod requests (-want +got):\n%s", diff)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Error("GC left the stale attachment's pod enrolled")
	}
}

// A pod that moved to another namespace between GC's ListPods and its
// RemovePod is refused by the daemon; GC leaves it and forgets the stale
// record, as when ListPods already showed the move.
func TestCNIGCPodMovedMeanwhile(t *testing.T) {
	e := newEnv(t)
	e.add(t, args(e.conf(t, "1.1.0", prevResults["1.1.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	e.fake.Fail("RemovePod", status.Error(codes.FailedPrecondition, "pod uid-1 is enrolled with netns_path /run/netns/pod2"))
	conf := e.conf(t, "1.1.0", "", map[string]any{keyValidAttachments: []any{}})
	if err := e.p.GC(&skel.CmdArgs{StdinData: conf, Path: "/opt/cni/bin"}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if att, _ := (attachments{e.dataDir}).Get("net", "ctr1", "eth0"); att != nil {
		t.Error("GC kept the stale record of a pod that moved")
	}
	if !strings.Contains(e.stderr.String(), "enrolled with another namespace since") {
		t.Errorf("log does not say why the pod was left:\n%s", e.stderr)
	}
}

func TestCNIGCReportsDaemonErrors(t *testing.T) {
	e := newEnv(t)
	e.add(t, args(e.conf(t, "1.1.0", prevResults["1.1.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	e.fake.Fail("RemovePod", status.Error(codes.Internal, "kernel says no"))
	conf := e.conf(t, "1.1.0", "", map[string]any{keyValidAttachments: []any{}})
	ce := asCNI(t, e.p.GC(&skel.CmdArgs{StdinData: conf, Path: "/opt/cni/bin"}))
	if ce.Code != 999 || !strings.Contains(ce.Msg, "kernel says no") {
		t.Errorf("got %d %q", ce.Code, ce.Msg)
	}
	// The record stays for the next GC, which succeeds.
	if err := e.p.GC(&skel.CmdArgs{StdinData: conf, Path: "/opt/cni/bin"}); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Fatal("second GC did not release the pod")
	}
}

// The log goes to logFile when one is set; stdout carries only the result.
func TestCNILogFile(t *testing.T) {
	e := newEnv(t)
	logFile := filepath.Join(t.TempDir(), "log", "cni.log")
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], map[string]any{"logFile": logFile, "logLevel": "debug"})
	e.add(t, args(conf, "ctr1", "/run/netns/pod1", k8sArgs1))
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "pod enrolled") || !strings.Contains(string(b), "uid-1") {
		t.Errorf("log file lacks the enrolment:\n%s", b)
	}
	if e.stderr.Len() != 0 {
		t.Errorf("stderr = %q with a logFile set", e.stderr)
	}
	jsonValue(t, e.stdout.String())
}

// A socket left behind by a crashed daemon refuses connections; ADD must
// say so with code 11 as it does for a missing socket.
func TestCNIAddConnectionRefused(t *testing.T) {
	e := newEnv(t)
	e.socket = filepath.Join(t.TempDir(), "stale.sock")
	l, err := net.Listen("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ce := asCNI(t, e.p.Add(args(e.conf(t, "1.0.0", prevResults["1.0.0"], nil), "ctr1", "/run/netns/pod1", k8sArgs1)))
	if ce.Code != 11 || !strings.Contains(ce.Msg, e.socket) || !strings.Contains(ce.Msg, "not available") {
		t.Errorf("got %d %q; want code 11 naming the socket", ce.Code, ce.Msg)
	}
	e.assertNothingDone(t)
}

// A daemon that does not answer within the config's timeout fails ADD
// with code 11, in about that time.
func TestCNIAddTimeout(t *testing.T) {
	e := newEnv(t)
	e.fake.Delay("AddPod", time.Minute)
	start := time.Now()
	ce := asCNI(t, e.p.Add(args(e.conf(t, "1.0.0", prevResults["1.0.0"], map[string]any{"timeout": "300ms"}), "ctr1", "/run/netns/pod1", k8sArgs1)))
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("ADD took %s with a 300ms timeout", took)
	}
	if ce.Code != 11 || !strings.Contains(ce.Msg, e.socket) {
		t.Errorf("got %d %q; want code 11 naming the socket", ce.Code, ce.Msg)
	}
	if e.stdout.Len() != 0 {
		t.Errorf("timed-out ADD printed %q", e.stdout)
	}
}

// The attachment of an old sandbox that was never deleted does not keep
// the pod enrolled once its current sandbox is deleted.
func TestCNIDelIgnoresOldSandboxRecord(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	e.add(t, args(conf, "ctr1", "/run/netns/old", k8sArgs1))
	current := args(conf, "ctr2", "/run/netns/new", k8sArgs1)
	e.add(t, current)
	if err := e.p.Del(current); err != nil {
		t.Fatal(err)
	}
	if p := e.fake.Pod("uid-1"); p != nil {
		t.Fatalf("pod still enrolled (%s) after DEL of its current sandbox", p.NetnsPath)
	}
}
