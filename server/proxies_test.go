package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/capture/capturetest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

// fakeZDS records what the server tells the node proxy. On every call it
// also notes whether the server's snapshot source lists the pod at that
// moment, which is what a proxy connecting just then would get.
type fakeZDS struct {
	store *state.Store

	mu      sync.Mutex
	calls   []string
	pods    map[string]zds.Pod
	waitErr error
	states  map[string]string
}

func newFakeZDS() *fakeZDS {
	return &fakeZDS{pods: map[string]zds.Pod{}, states: map[string]string{}}
}

func (f *fakeZDS) listed(uid string) bool {
	pods, err := zds.StorePods{Store: f.store}.Pods()
	if err != nil {
		panic(err)
	}
	return slices.ContainsFunc(pods, func(p zds.Pod) bool { return p.UID == uid })
}

func (f *fakeZDS) PodAdded(p zds.Pod) {
	listed := f.listed(p.UID)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("add %s listed=%v", p.UID, listed))
	f.pods[p.UID] = p
	f.states[p.UID] = "pending"
}

func (f *fakeZDS) PodAddedWait(_ context.Context, p zds.Pod) error {
	listed := f.listed(p.UID)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("addwait %s listed=%v", p.UID, listed))
	f.pods[p.UID] = p
	if f.waitErr != nil {
		f.states[p.UID] = "no proxy connected"
		return f.waitErr
	}
	f.states[p.UID] = zds.StateAcked
	return nil
}

func (f *fakeZDS) PodRemoved(uid string) {
	listed := f.listed(uid)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("del %s listed=%v", uid, listed))
	delete(f.states, uid)
}

func (f *fakeZDS) State(uid string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.states[uid]; ok {
		return st
	}
	return "no proxy connected"
}

func (f *fakeZDS) ack(uid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[uid] = zds.StateAcked
}

// forget makes the pod unacked, as a proxy that reconnected and has not
// acked it yet.
func (f *fakeZDS) forget(uid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[uid] = "pending"
}

func (f *fakeZDS) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// fakeProbe records the node table calls.
type fakeProbe struct {
	mu        sync.Mutex
	calls     []string
	reconcile map[string][]netip.Addr
}

func (f *fakeProbe) Add(_ context.Context, uid string, addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("add %s %v", uid, addrs))
	return nil
}

func (f *fakeProbe) Remove(_ context.Context, uid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "remove "+uid)
	return nil
}

func (f *fakeProbe) Reconcile(_ context.Context, pods map[string][]netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("reconcile %d", len(pods)))
	f.reconcile = pods
	return nil
}

func (f *fakeProbe) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func startProxiedServer(t *testing.T, requireAck bool) (*testServer, *fakeZDS, *fakeProbe) {
	t.Helper()
	z, p := newFakeZDS(), &fakeProbe{}
	ts := startServer(t, true, func(c *testConfig) {
		c.Pods.ZDS, c.Pods.ZDSRequireAck, c.Pods.Probe = z, requireAck, p
	})
	z.store = ts.pods.Store()
	return ts, z, p
}

func wantCalls(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s calls:\n got %q\nwant %q", what, got, want)
	}
}

func TestProxiesFollowEnrolment(t *testing.T) {
	ts, z, p := startProxiedServer(t, false)
	ns := ts.newNS(t)
	wantCalls(t, "startup probe", p.takeCalls(), "reconcile 0")

	sa := "web-sa"
	resp, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "pod-1", PodName: "web", PodNamespace: "shop",
		NetnsPath: ns, PodIps: []string{"10.244.0.9", "fd00::9"}, ServiceAccount: &sa})
	if err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "probe", p.takeCalls(), "add pod-1 [10.244.0.9 fd00::9]")
	// The pod is in the snapshot source before the proxy is told, so a
	// proxy connecting in between misses nothing.
	wantCalls(t, "zds", z.takeCalls(), "add pod-1 listed=true")
	if got := resp.GetPod().GetZdsState(); got != "pending" {
		t.Errorf("AddPod reply zds_state %q, want pending", got)
	}
	zp := z.pods["pod-1"]
	if zp.Name != "web" || zp.Namespace != "shop" || zp.ServiceAccount != "web-sa" || zp.NetnsPath != ns || zp.NetnsID.String() != resp.GetPod().GetNetnsId() {
		t.Errorf("the proxy was told %+v; want the record's name, namespace, service account, path and id (%s)", zp, resp.GetPod().GetNetnsId())
	}
	pods, err := zds.StorePods{Store: ts.pods.Store()}.Pods()
	if err != nil || len(pods) != 1 || pods[0] != zp {
		t.Errorf("ZDSPods = %+v, %v; want the one pod as sent", pods, err)
	}

	z.ack("pod-1")
	if got := ts.get(t, "pod-1").GetPod().GetZdsState(); got != "acked" {
		t.Errorf("GetPod zds_state %q, want acked", got)
	}
	list, err := ts.api.ListPods(ctxT(t), &nftredirv1.ListPodsRequest{})
	if err != nil || len(list.Pods) != 1 || list.Pods[0].GetZdsState() != "acked" {
		t.Errorf("ListPods = %v, %v; want zds_state acked", list, err)
	}
	// A repeat that changes nothing does not make the proxy rebuild the
	// pod; the node table is re-asserted.
	if _, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "pod-1", PodName: "web", PodNamespace: "shop",
		NetnsPath: ns, PodIps: []string{"10.244.0.9", "fd00::9"}, ServiceAccount: &sa}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "zds after a repeat", z.takeCalls())
	wantCalls(t, "probe after a repeat", p.takeCalls(), "add pod-1 [10.244.0.9 fd00::9]")

	if _, err := ts.pods.Reconcile(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "probe after reconcile", p.takeCalls(), "reconcile 1")
	if got := p.reconcile["pod-1"]; len(got) != 2 {
		t.Errorf("reconcile gave the node table %v for pod-1", got)
	}

	if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "probe after remove", p.takeCalls(), "remove pod-1")
	// Gone from the snapshot source before the proxy is told.
	wantCalls(t, "zds after remove", z.takeCalls(), "del pod-1 listed=false")
	// An unknown pod: nothing to tell anyone.
	if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "zds after a second remove", z.takeCalls())
	wantCalls(t, "probe after a second remove", p.takeCalls())
}

func TestReconcileDropTellsProxies(t *testing.T) {
	ts, z, p := startProxiedServer(t, false)
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	z.takeCalls()
	p.takeCalls()
	ts.w.DeleteNamespace(t, ns)
	res, err := ts.pods.Reconcile(ctxT(t))
	if err != nil || res.Dropped != 1 {
		t.Fatalf("Reconcile = %+v, %v; want one drop", res, err)
	}
	wantCalls(t, "probe", p.takeCalls(), "remove pod-1", "reconcile 0")
	wantCalls(t, "zds", z.takeCalls(), "del pod-1 listed=false")
}

// A new pod the node proxy does not take is not left captured: the
// namespace is as before the AddPod, the pod not enrolled, the proxy told
// to forget it; the retry the error asks for waits again and succeeds
// once acked.
func TestRequireAckFailureOfANewPodChangesNothing(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		z, p := newFakeZDS(), &fakeProbe{}
		ts := startServer(t, true, withWorld(w), func(c *testConfig) { c.Pods.ZDS, c.Pods.ZDSRequireAck, c.Pods.Probe = z, true, p })
		z.store = ts.pods.Store()
		ns := ts.newNS(t)
		before := w.Dump(t, ns)
		z.waitErr = zds.ErrNoProxy
		p.takeCalls()
		for try := 1; try <= 2; try++ {
			_, err := ts.add(t, "pod-1", ns)
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "pod pod-1 was not captured: the node proxy has not taken it") ||
				!strings.Contains(err.Error(), zds.ErrNoProxy.Error()) || !strings.Contains(err.Error(), "retry AddPod") {
				t.Fatalf("try %d: AddPod without an ack: %v; want Unavailable saying nothing changed and to retry", try, err)
			}
			if got := w.Dump(t, ns); got != before {
				t.Fatalf("try %d: the failed AddPod changed the namespace\n--- before\n%s\n--- after\n%s", try, before, got)
			}
			if n := len(ts.records(t)); n != 0 {
				t.Fatalf("try %d: %d records after the failed AddPod", try, n)
			}
			wantCalls(t, "zds", z.takeCalls(), "addwait pod-1 listed=true", "del pod-1 listed=false")
			wantCalls(t, "probe", p.takeCalls(), "add pod-1 [10.244.0.9]", "remove pod-1")
		}
		z.waitErr = nil
		resp, err := ts.add(t, "pod-1", ns)
		if err != nil || resp.GetPod().GetZdsState() != "acked" {
			t.Fatalf("retried AddPod: %v, %v; want OK and acked", resp, err)
		}
		wantCalls(t, "zds", z.takeCalls(), "addwait pod-1 listed=true")
		// Acked and unchanged: a repeat does not wait for the proxy again.
		if _, err := ts.add(t, "pod-1", ns); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, "zds after a repeat", z.takeCalls())
	})
}

// A pod captured before keeps its capture when a later AddPod's wait for
// the ack fails: it is enrolled, and the retry waits again.
func TestRequireAckFailureKeepsAnEnrolledPod(t *testing.T) {
	ts, z, _ := startProxiedServer(t, true)
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	z.takeCalls()
	z.forget("pod-1")
	z.waitErr = zds.ErrNoProxy
	_, err := ts.add(t, "pod-1", ns)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "pod pod-1 is captured but the node proxy has not taken it") {
		t.Fatalf("AddPod without an ack: %v; want Unavailable saying the pod is captured", err)
	}
	got := ts.get(t, "pod-1")
	if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("after the failed wait: %v; want IN_SYNC", got.SyncStatus)
	}
	z.waitErr = nil
	if resp, err := ts.add(t, "pod-1", ns); err != nil || resp.GetPod().GetZdsState() != "acked" {
		t.Fatalf("retried AddPod: %v, %v; want OK and acked", resp, err)
	}
}

func TestFailedAddTellsTheProxyToForgetThePod(t *testing.T) {
	z, p := newFakeZDS(), &fakeProbe{}
	ts := startServer(t, true, func(c *testConfig) { c.Pods.ZDS, c.Pods.Probe = z, p })
	z.store = ts.pods.Store()
	ns := ts.newNS(t)
	p.takeCalls()
	ts.w.fake.FailNext(capturetest.OpApply, errInjected)
	if _, err := ts.add(t, "pod-1", ns); err == nil {
		t.Fatal("AddPod succeeded with a failing engine")
	}
	// A proxy that connected while the record existed may hold the pod.
	wantCalls(t, "zds", z.takeCalls(), "del pod-1 listed=false")
	wantCalls(t, "probe", p.takeCalls())
}

func TestBeforeServing(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	ts := startServer(t, false, func(c *testConfig) {
		c.BeforeServing = func(context.Context) error {
			close(entered)
			<-release
			return nil
		}
	})
	<-entered
	resp, err := ts.health.Check(ctxT(t), &healthgrpc.HealthCheckRequest{Service: nftredirv1.ServiceName})
	if err != nil || resp.Status != healthgrpc.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health while BeforeServing runs: %v, %v; want NOT_SERVING", resp, err)
	}
	close(release)
	ts.waitServing(t)

	failing := errors.New("no ZDS socket")
	srv, err := New(Config{Pods: ts.pods, ReconcileInterval: -1,
		BeforeServing: func(context.Context) error { return failing }})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Run(context.Background(), lis, 0); !errors.Is(err, failing) {
		t.Errorf("Run with a failing BeforeServing: %v, want it to fail with %v", err, failing)
	}
	if srv.ready.Load() {
		t.Error("SERVING although BeforeServing failed")
	}
}
