package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/lifecycle"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

func withTeardownGrace(d time.Duration) serverOpt {
	return func(c *testConfig) { c.Pods.TeardownGrace = d }
}

func (ts *testServer) remove(t *testing.T, req *nftredirv1.RemovePodRequest) (*nftredirv1.RemovePodResponse, error) {
	t.Helper()
	return ts.api.RemovePod(ctxT(t), req)
}

// leftovers counts the records left for teardown.
func (ts *testServer) leftovers(t *testing.T) int {
	t.Helper()
	l, err := ts.pods.Store().Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// waitSettled waits for every leftover to be settled, then checks that
// the namespace holds nothing of ours.
func (ts *testServer) waitSettled(t *testing.T, path string) {
	t.Helper()
	waitFor(t, func() bool { return ts.leftovers(t) == 0 })
	if st := ts.look(t, path); !st.untouched() {
		t.Fatalf("namespace holds %+v after its leftover was settled", st)
	}
}

// TestRemovePodWithNetnsPath: the path is a precondition. A release for a
// namespace the pod is no longer enrolled with changes nothing and says
// where the pod is; one for its namespace releases it.
func TestRemovePodWithNetnsPath(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		oldNS, newNS := ts.newNS(t), ts.newNS(t)
		ts.mustAdd(t, "pod-1", newNS)

		_, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: oldNS})
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), newNS) {
			t.Fatalf("RemovePod naming another namespace = %v; want FailedPrecondition naming %s", err, newNS)
		}
		if st := ts.look(t, newNS); !st.captured() || len(ts.records(t)) != 1 {
			t.Fatalf("a refused RemovePod changed the pod: %+v, %d records", st, len(ts.records(t)))
		}

		resp, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: newNS})
		if err != nil || !resp.Existed {
			t.Fatalf("RemovePod naming the pod's namespace = %v, %v", resp, err)
		}
		if st := ts.look(t, newNS); !st.untouched() || len(ts.records(t)) != 0 {
			t.Fatalf("capture (%+v) or record left after the release", st)
		}
		resp, err = ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: newNS})
		if err != nil || resp.Existed {
			t.Errorf("RemovePod of a pod not enrolled = %v, %v; want OK, existed false", resp, err)
		}
	})
}

func TestRemovePodRefusesABadNetnsPath(t *testing.T) {
	ts := startServer(t, true)
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	for _, path := range []string{"relative/ns", ns + "/../" + filepath.Base(ns), "/var/run/netns/a\nb"} {
		_, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: path, NamespaceTeardown: true})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "netns_path") {
			t.Errorf("RemovePod with netns_path %q = %v; want InvalidArgument about netns_path", path, err)
		}
	}
	if st := ts.look(t, ns); !st.captured() || len(ts.records(t)) != 1 || ts.leftovers(t) != 0 {
		t.Fatalf("a refused RemovePod changed the pod: %+v", st)
	}
}

// TestTeardownReleasesWithoutEnteringTheNamespace: with
// namespace_teardown the pod is released at once and its namespace is not
// opened; the namespace stays the pod's until it is settled. If it
// outlives the grace, the daemon removes the capture itself.
func TestTeardownReleasesWithoutEnteringTheNamespace(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w), withTeardownGrace(time.Hour))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		opens := 0
		if w.fake != nil {
			opens = w.fake.Calls(capturetest.OpOpen)
		}
		resp, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: ns, NamespaceTeardown: true})
		if err != nil || !resp.Existed {
			t.Fatalf("RemovePod with namespace_teardown = %v, %v", resp, err)
		}
		if w.fake != nil && w.fake.Calls(capturetest.OpOpen) != opens {
			t.Errorf("the release opened the namespace %d times", w.fake.Calls(capturetest.OpOpen)-opens)
		}
		if st := ts.look(t, ns); !st.captured() {
			t.Errorf("the namespace was changed: %+v", st)
		}
		if len(ts.records(t)) != 0 || ts.leftovers(t) != 1 {
			t.Fatalf("%d records, %d left for teardown; want none and one", len(ts.records(t)), ts.leftovers(t))
		}
		list, err := ts.api.ListPods(ctxT(t), &nftredirv1.ListPodsRequest{})
		if err != nil || len(list.Pods) != 0 {
			t.Errorf("ListPods after the release = %v, %v; want no pods", list, err)
		}
		if _, err := ts.api.GetPod(ctxT(t), &nftredirv1.GetPodRequest{PodUid: "pod-1"}); status.Code(err) != codes.NotFound {
			t.Errorf("GetPod after the release = %v; want NotFound", err)
		}
		if resp, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: ns, NamespaceTeardown: true}); err != nil || resp.Existed {
			t.Errorf("repeated RemovePod = %v, %v; want OK, existed false", resp, err)
		}
		if _, err := ts.add(t, "pod-2", ns); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "pod-1") {
			t.Errorf("AddPod of another pod into the namespace left for teardown = %v; want FailedPrecondition naming pod-1", err)
		}
		if res, err := ts.pods.Reconcile(ctxT(t)); err != nil || res != (lifecycle.ReconcileResult{}) || !ts.look(t, ns).captured() {
			t.Errorf("Reconcile within the grace = %+v, %v; want nothing done", res, err)
		}

		// A release that may enter the namespace settles it now.
		if resp, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil || resp.Existed {
			t.Fatalf("plain RemovePod after the teardown = %v, %v", resp, err)
		}
		if st := ts.look(t, ns); !st.untouched() || ts.leftovers(t) != 0 {
			t.Fatalf("after a plain RemovePod: %+v, %d left for teardown", st, ts.leftovers(t))
		}
		ts.mustAdd(t, "pod-2", ns) // the namespace is free again
	})
}

// TestTeardownGraceRemovesWhatOutlivesIt: the namespace survived its
// teardown, so the capture is removed when the grace ends, with no call.
func TestTeardownGraceRemovesWhatOutlivesIt(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		grace := 2 * time.Second
		ts := startServer(t, true, withWorld(w), withTeardownGrace(grace))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		released := time.Now()
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
		if st := ts.look(t, ns); !st.captured() && time.Since(released) < grace {
			t.Fatalf("the capture went before the grace ended: %+v", st)
		}
		ts.waitSettled(t, ns)
		// The timer's settle drops the leftover before it gives up the
		// claim and the pod's lock; an AddPod in between is refused, as
		// during any settle. Once it is done the namespace is free.
		waitFor(t, func() bool {
			_, err := ts.add(t, "pod-2", ns)
			if err != nil && status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("AddPod of another pod after the settle: %v", err)
			}
			return err == nil
		})
	})
}

// TestTeardownOfADeletedNamespace: the common case. The runtime deletes
// the namespace; the leftover is forgotten without any kernel work.
func TestTeardownOfADeletedNamespace(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w), withTeardownGrace(100*time.Millisecond))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
		removes := 0
		if w.fake != nil {
			removes = w.fake.Calls(capturetest.OpRemove)
		}
		w.DeleteNamespace(t, ns)
		waitFor(t, func() bool { return ts.leftovers(t) == 0 })
		if w.fake != nil && w.fake.Calls(capturetest.OpRemove) != removes {
			t.Errorf("settling a deleted namespace called Remove")
		}
		if strings.Contains(ts.logs.String(), "cannot settle") {
			t.Errorf("settling a deleted namespace failed:\n%s", ts.logs.String())
		}
	})
}

// TestTeardownThenReenrol: the runtime DELs and ADDs the same sandbox (a
// retried ADD) before the grace ends. Settling the leftover must not take
// the new enrolment's capture, nor free the namespace the pod holds again.
func TestTeardownThenReenrol(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		dir := filepath.Join(t.TempDir(), "pods")
		ts := startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Hour))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: ns, NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
		ts.mustAdd(t, "pod-1", ns)
		ts.stop()
		// Restarted past the grace: the start-up reconcile settles the
		// leftover while the pod is enrolled in its namespace again.
		ts = startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Nanosecond))
		waitFor(t, func() bool { return ts.leftovers(t) == 0 })
		if st := ts.look(t, ns); !st.captured() {
			t.Fatalf("settling removed the new enrolment's capture: %+v", st)
		}
		if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Errorf("re-enrolled pod: %v %q", got.SyncStatus, got.Detail)
		}
		if _, err := ts.add(t, "pod-2", ns); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("settling freed the namespace the pod holds again: AddPod of another pod = %v", err)
		}
	})
}

// TestTeardownThenEnrolElsewhere: the pod's next sandbox is another
// namespace. The old one is cleaned when settled; the new one stays the
// pod's.
func TestTeardownThenEnrolElsewhere(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		dir := filepath.Join(t.TempDir(), "pods")
		ts := startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Hour))
		oldNS, newNS := ts.newNS(t), ts.newNS(t)
		ts.mustAdd(t, "pod-1", oldNS)
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: oldNS, NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
		ts.mustAdd(t, "pod-1", newNS)
		if _, err := ts.add(t, "pod-2", oldNS); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("AddPod of another pod into the old namespace before it is settled = %v; want FailedPrecondition", err)
		}
		// A late DEL of the old sandbox changes nothing.
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NetnsPath: oldNS, NamespaceTeardown: true}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("RemovePod naming the old namespace = %v; want FailedPrecondition (the pod is enrolled in the new one)", err)
		}
		ts.stop()
		ts = startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Nanosecond))
		ts.waitSettled(t, oldNS)
		if st := ts.look(t, newNS); !st.captured() {
			t.Fatalf("the new enrolment lost its capture: %+v", st)
		}
		if _, err := ts.add(t, "pod-3", newNS); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("settling the old namespace freed the new one: AddPod of another pod = %v", err)
		}
		ts.mustAdd(t, "pod-2", oldNS)
	})
}

// TestTeardownSettleLeavesAnotherPodsTable: a failed re-enrolment of the
// pod in its leftover's namespace is rolled back; whether or not another
// pod may take the namespace then, settling the leftover never removes
// that pod's capture.
func TestTeardownSettleLeavesAnotherPodsTable(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w), withTeardownGrace(time.Hour))
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
		t.Fatal(err)
	}
	w.fake.FailNext(capturetest.OpApply, errInjected)
	if _, err := ts.add(t, "pod-1", ns); err == nil {
		t.Fatal("AddPod with a failing engine succeeded")
	}
	_, addErr := ts.add(t, "pod-2", ns)
	if addErr != nil && status.Code(addErr) != codes.FailedPrecondition {
		t.Fatalf("AddPod of another pod = %v; want success or FailedPrecondition", addErr)
	}
	if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatalf("plain RemovePod settling the leftover: %v", err)
	}
	if ts.leftovers(t) != 0 {
		t.Errorf("%d left for teardown after a plain RemovePod", ts.leftovers(t))
	}
	if addErr == nil {
		if got := ts.get(t, "pod-2"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Fatalf("settling pod-1's leftover took pod-2's capture: %v %q", got.SyncStatus, got.Detail)
		}
		return
	}
	ts.mustAdd(t, "pod-2", ns)
}

// TestTeardownTwiceInOneNamespace: the pod is released, enrolled again
// and released again in one namespace within the grace. The namespace
// stays the pod's until the last leftover is settled.
func TestTeardownTwiceInOneNamespace(t *testing.T) {
	ts := startServer(t, true, withTeardownGrace(time.Hour))
	ns := ts.newNS(t)
	for range 2 {
		ts.mustAdd(t, "pod-1", ns)
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
	}
	if n := ts.leftovers(t); n != 2 {
		t.Fatalf("%d left for teardown, want 2", n)
	}
	all, err := ts.pods.Store().Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	// Drop the older by hand, as a settle of it alone would.
	if err := ts.pods.Store().DropLeftover(all[0].Path); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.add(t, "pod-2", ns); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("AddPod of another pod while a leftover remains = %v; want FailedPrecondition", err)
	}
	if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatal(err)
	}
	ts.mustAdd(t, "pod-2", ns)
}

// TestTeardownSurvivesRestart: a daemon restarted before the grace ends
// still knows the namespace is the pod's, and settles it when it is due.
func TestTeardownSurvivesRestart(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		dir := filepath.Join(t.TempDir(), "pods")
		ts := startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Hour))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
			t.Fatal(err)
		}
		ts.stop()

		ts = startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Hour))
		if _, err := ts.add(t, "pod-2", ns); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("after a restart, AddPod of another pod into the namespace left for teardown = %v; want FailedPrecondition", err)
		}
		if !ts.look(t, ns).captured() {
			t.Errorf("the restart settled the namespace before its grace")
		}
		ts.stop()

		// Restarted once the grace has passed: the start-up reconcile
		// settles it.
		ts = startServer(t, true, withWorld(w), withStateDir(dir), withTeardownGrace(time.Nanosecond))
		ts.waitSettled(t, ns)
		ts.mustAdd(t, "pod-2", ns)
	})
}

// TestTeardownOfARemovalUnderWay: a record already marked Removing (a
// release that failed midway) is finished by entering the namespace, as
// recorded, even when the repeat asks for teardown.
func TestTeardownOfARemovalUnderWay(t *testing.T) {
	ts := startServer(t, true, withTeardownGrace(time.Hour))
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	rec, err := ts.pods.Store().Get("pod-1")
	if err != nil || rec == nil {
		t.Fatal(rec, err)
	}
	rec.Removing = true
	if err := ts.pods.Store().Put(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
		t.Fatal(err)
	}
	if st := ts.look(t, ns); !st.untouched() || ts.leftovers(t) != 0 || len(ts.records(t)) != 0 {
		t.Errorf("after finishing the removal: %+v, %d left for teardown, %d records", st, ts.leftovers(t), len(ts.records(t)))
	}
}

// TestTeardownCorruptLeftoverIsQuarantined: a record left for teardown
// that no longer decodes joins the quarantine, where RemovePod releases
// what it can still read of it.
func TestTeardownCorruptLeftoverIsQuarantined(t *testing.T) {
	ts := startServer(t, true, withTeardownGrace(time.Hour))
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	if _, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(ts.pods.Store().Dir(), state.TeardownDir, "*"))
	if err != nil || len(files) != 1 {
		t.Fatal(files, err)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files[0], data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if ts.leftovers(t) != 0 {
		t.Fatal("a corrupt leftover is listed")
	}
	q, err := ts.pods.Store().QuarantinedFor("pod-1")
	if err != nil || len(q) != 1 {
		t.Fatalf("quarantined: %v, %v; want the corrupt leftover", q, err)
	}
	if resp, err := ts.remove(t, &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil || !resp.Existed {
		t.Fatalf("RemovePod of the quarantined leftover's pod = %v, %v", resp, err)
	}
	if st := ts.look(t, ns); !st.untouched() {
		t.Errorf("the quarantined leftover's capture is still there: %+v", st)
	}
}
