package server

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// scriptedPolicy answers Admit with whatever the test sets, and records
// what the server told it.
type scriptedPolicy struct {
	mu      sync.Mutex
	admit   func(req *nftredirv1.AddPodRequest, id netns.ID) (lifecycle.Admission, error)
	ids     []netns.ID
	added   []string // "uid captured|uncaptured|error: code"
	removed []string
}

func (p *scriptedPolicy) Admit(_ context.Context, req *nftredirv1.AddPodRequest, id netns.ID) (lifecycle.Admission, error) {
	p.mu.Lock()
	p.ids = append(p.ids, id)
	f := p.admit
	p.mu.Unlock()
	return f(req, id)
}

func (p *scriptedPolicy) Added(req *nftredirv1.AddPodRequest, captured bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err != nil:
		p.added = append(p.added, req.GetPodUid()+" error: "+status.Code(toStatus(err)).String())
	case captured:
		p.added = append(p.added, req.GetPodUid()+" captured")
	default:
		p.added = append(p.added, req.GetPodUid()+" uncaptured")
	}
}

func (p *scriptedPolicy) Removed(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removed = append(p.removed, uid)
}

func (p *scriptedPolicy) log() (added, removed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.added...), append([]string(nil), p.removed...)
}

func withPolicy(p lifecycle.Policy) serverOpt { return func(c *testConfig) { c.Pods.Policy = p } }

// fillIdentity is what a Kubernetes policy does: the caller's request with
// name, namespace and service account from the API.
func fillIdentity(req *nftredirv1.AddPodRequest, _ netns.ID) (lifecycle.Admission, error) {
	out := proto.Clone(req).(*nftredirv1.AddPodRequest)
	sa := "web-sa"
	out.PodName, out.PodNamespace, out.ServiceAccount = "web", "shop", &sa
	return lifecycle.Admission{Request: out}, nil
}

func TestPolicyFillsIdentity(t *testing.T) {
	pol := &scriptedPolicy{admit: fillIdentity}
	ts := startServer(t, true, withPolicy(pol))
	ns := ts.newNS(t)
	resp, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "uid-1", NetnsPath: ns})
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.GetPod(); p.GetServiceAccount() != "web-sa" || p.GetPodName() != "web" || p.GetPodNamespace() != "shop" || resp.GetNotCapturedReason() != "" {
		t.Fatalf("AddPod = %v; want the policy's identity", resp)
	}
	if !ts.look(t, ns).captured() {
		t.Fatal("admitted pod not captured")
	}
	if got := ts.get(t, "uid-1").GetPod().GetServiceAccount(); got != "web-sa" {
		t.Errorf("GetPod service account %q", got)
	}
	if id := ts.w.id(t, ns); len(pol.ids) != 1 || pol.ids[0] != id {
		t.Errorf("Admit saw namespaces %v, want [%v]", pol.ids, id)
	}
	if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "uid-1"}); err != nil {
		t.Fatal(err)
	}
	added, removed := pol.log()
	if strings.Join(added, ",") != "uid-1 captured" || strings.Join(removed, ",") != "uid-1" {
		t.Errorf("policy heard added=%v removed=%v", added, removed)
	}
}

func TestPolicyLeavesPodUncapturedAndReleasesIt(t *testing.T) {
	pol := &scriptedPolicy{admit: fillIdentity}
	ts := startServer(t, true, withPolicy(pol))
	ns := ts.newNS(t)
	if _, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "uid-2", NetnsPath: ns}); err != nil {
		t.Fatal(err)
	}
	pol.mu.Lock()
	pol.admit = func(*nftredirv1.AddPodRequest, netns.ID) (lifecycle.Admission, error) {
		return lifecycle.Admission{NotCaptured: "namespace shop is not labelled"}, nil
	}
	pol.mu.Unlock()
	resp, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "uid-2", NetnsPath: ns})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPod() != nil || resp.GetNotCapturedReason() != "namespace shop is not labelled" {
		t.Fatalf("AddPod = %v; want not captured with the policy's reason", resp)
	}
	if st := ts.look(t, ns); !st.untouched() {
		t.Errorf("capture left in a pod the policy no longer captures: %+v", st)
	}
	if len(ts.records(t)) != 0 {
		t.Error("record left for an uncaptured pod")
	}
	if _, err := ts.api.GetPod(ctxT(t), &nftredirv1.GetPodRequest{PodUid: "uid-2"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetPod of an uncaptured pod: %v, want NotFound", err)
	}
	added, _ := pol.log()
	if strings.Join(added, ",") != "uid-2 captured,uid-2 uncaptured" {
		t.Errorf("policy heard %v", added)
	}
}

// TestUncapturedAnswerTouchesNothingElse: a not-captured answer for a
// pod that is not enrolled is the whole of that AddPod. What the daemon
// still keeps of the pod (a namespace left for teardown, a quarantined
// record) is not released on the way: that is RemovePod's work, and the
// teardown grace's, as it is when the policy captures the pod.
func TestUncapturedAnswerTouchesNothingElse(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		pol := &scriptedPolicy{admit: fillIdentity}
		ts := startServer(t, true, withWorld(w), withPolicy(pol), withTeardownGrace(time.Hour))
		left, quarantined, sandbox := ts.newNS(t), ts.newNS(t), ts.newNS(t)
		ts.mustAdd(t, "pod-1", left)
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: left, NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
		ts.mustAdd(t, "pod-1", quarantined)
		ts.corrupt(t, "pod-1", func([]byte) []byte { return []byte("{not json") })
		if rec, err := ts.pods.Store().Get("pod-1"); err != nil || rec != nil {
			t.Fatalf("Get of a corrupt record = %v, %v; want it quarantined", rec, err)
		}
		pol.mu.Lock()
		pol.admit = func(*nftredirv1.AddPodRequest, netns.ID) (lifecycle.Admission, error) {
			return lifecycle.Admission{NotCaptured: "namespace shop is not labelled"}, nil
		}
		pol.mu.Unlock()

		changes, opens := 0, 0
		if w.fake != nil {
			changes, opens = w.fake.Changes(), w.fake.Calls(capturetest.OpOpen)
		}
		resp, err := ts.add(t, "pod-1", sandbox)
		if err != nil || resp.GetNotCapturedReason() == "" {
			t.Fatalf("AddPod = %v, %v; want not captured", resp, err)
		}
		if w.fake != nil {
			if n := w.fake.Calls(capturetest.OpOpen) - opens; n != 1 {
				t.Errorf("the not-captured AddPod opened %d namespaces; want only the request's", n)
			}
			if w.fake.Changes() != changes {
				t.Error("the not-captured AddPod programmed a namespace")
			}
		}
		for name, ns := range map[string]string{"left for teardown": left, "quarantined": quarantined} {
			if st := ts.look(t, ns); !st.captured() {
				t.Errorf("the namespace %s was released by a not-captured AddPod: %+v", name, st)
			}
		}
		if !ts.look(t, sandbox).untouched() {
			t.Error("the not-captured sandbox was programmed")
		}
		qs, err := ts.pods.Store().QuarantinedFor("pod-1")
		if err != nil || len(qs) != 1 || ts.leftovers(t) != 1 {
			t.Fatalf("%d quarantined (%v), %d left for teardown; want one of each", len(qs), err, ts.leftovers(t))
		}

		// RemovePod releases both, as it always has.
		if resp, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil || !resp.Existed {
			t.Fatalf("RemovePod = %v, %v", resp, err)
		}
		for _, ns := range []string{left, quarantined} {
			if st := ts.look(t, ns); !st.untouched() {
				t.Errorf("RemovePod left %+v", st)
			}
		}
		if added, _ := pol.log(); strings.Join(added, ",") != "pod-1 captured,pod-1 captured,pod-1 uncaptured" {
			t.Errorf("policy heard %v", added)
		}
	})
}

func TestPolicyRefusalChangesNothing(t *testing.T) {
	w := fakeWorld(t)
	ns := w.NewNamespace(t)
	tests := []struct {
		name  string
		admit func(*nftredirv1.AddPodRequest, netns.ID) (lifecycle.Admission, error)
		code  codes.Code
		msg   string
	}{
		{"policy error keeps its code", func(*nftredirv1.AddPodRequest, netns.ID) (lifecycle.Admission, error) {
			return lifecycle.Admission{}, status.Error(codes.InvalidArgument, "pod shop/web: annotation nftredir.io/capture-mode: \"nat\" is not a capture mode")
		}, codes.InvalidArgument, "nftredir.io/capture-mode"},
		{"API unreachable", func(*nftredirv1.AddPodRequest, netns.ID) (lifecycle.Admission, error) {
			return lifecycle.Admission{}, status.Error(codes.Unavailable, "look up pod shop/web: connection refused; retry")
		}, codes.Unavailable, "connection refused"},
		{"filled-in options are validated like a request's", func(req *nftredirv1.AddPodRequest, id netns.ID) (lifecycle.Admission, error) {
			a, _ := fillIdentity(req, id)
			a.Request.Options = &nftredirv1.RedirectOptions{ExcludeInboundPorts: []uint32{70000}}
			return a, nil
		}, codes.InvalidArgument, "pod shop/web: invalid request: options.exclude_inbound_ports: 70000 is not a port"},
		{"policy may not change the key", func(req *nftredirv1.AddPodRequest, id netns.ID) (lifecycle.Admission, error) {
			a, _ := fillIdentity(req, id)
			a.Request.PodUid = "someone-else"
			return a, nil
		}, codes.Internal, "instead of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := &scriptedPolicy{admit: tt.admit}
			ts := startServer(t, true, withWorld(w), withPolicy(pol))
			changes := w.fake.Changes()
			_, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "uid-3", NetnsPath: ns})
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("AddPod = %v; want %v containing %q", err, tt.code, tt.msg)
			}
			if st := ts.look(t, ns); !st.untouched() || w.fake.Changes() != changes || len(ts.records(t)) != 0 {
				t.Errorf("a refused AddPod changed something: %+v", st)
			}
			if added, _ := pol.log(); len(added) != 1 || !strings.HasPrefix(added[0], "uid-3 error: "+tt.code.String()) {
				t.Errorf("policy heard %v", added)
			}
		})
	}
}

func TestPolicyIsNotAskedAboutHostilePaths(t *testing.T) {
	pol := &scriptedPolicy{admit: fillIdentity}
	ts := startServer(t, true, withPolicy(pol))
	_, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "uid-4", NetnsPath: ts.w.NotNamespace(t)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("AddPod of a non-namespace: %v", err)
	}
	if len(pol.ids) != 0 {
		t.Error("the policy was asked about a path that is not a namespace")
	}
}

func TestReleaseDoesNotTellThePolicy(t *testing.T) {
	pol := &scriptedPolicy{admit: fillIdentity}
	ts := startServer(t, true, withPolicy(pol))
	ns := ts.newNS(t)
	if _, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "uid-5", NetnsPath: ns}); err != nil {
		t.Fatal(err)
	}
	existed, err := ts.pods.Release(ctxT(t), "uid-5")
	if err != nil || !existed {
		t.Fatalf("Release = %v, %v", existed, err)
	}
	if st := ts.look(t, ns); !st.untouched() {
		t.Errorf("capture left after Release: %+v", st)
	}
	if _, removed := pol.log(); len(removed) != 0 {
		t.Errorf("Release told the policy %v", removed)
	}
}
