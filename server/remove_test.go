package server

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/lifecycle"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// readOnly bind-mounts dir read-only over itself, as a state directory on
// a file system remounted ro would be; the returned func (also run at
// cleanup) makes it writable again. As root, file modes would not stop
// the writes. The mount is private, so it reaches no other namespace.
func readOnly(t *testing.T, dir string) (writable func()) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", dir, err)
	}
	done := false
	writable = func() {
		if !done {
			done = true
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		}
	}
	t.Cleanup(writable)
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make %s private: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
	return writable
}

// TestRemovePodOnReadOnlyStateDirChangesNothing: a RemovePod that cannot
// record its outcome must leave the pod exactly as it was, captured and
// enrolled, so that neither the reply nor a later reconcile contradicts
// the kernel; once the directory is writable again the same call works.
func TestRemovePodOnReadOnlyStateDirChangesNothing(t *testing.T) {
	w := kernelWorld(t)
	ts := startServer(t, true, withWorld(w))
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	before := ts.look(t, ns)
	writable := readOnly(t, ts.pods.Store().Dir())

	_, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"})
	if err == nil {
		t.Fatal("RemovePod succeeded on a read-only state directory")
	}
	if st := status.Convert(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "read-only file system") {
		t.Errorf("RemovePod = %v; want Internal naming the read-only file system", err)
	}
	if st := ts.look(t, ns); st != before || !st.captured() {
		t.Fatalf("a failed RemovePod changed the pod's capture: %+v, before it %+v", st, before)
	}
	if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("after the failed RemovePod: %v %q, want IN_SYNC", got.SyncStatus, got.Detail)
	}
	if res, err := ts.pods.Reconcile(ctxT(t)); err != nil || res != (lifecycle.ReconcileResult{InSync: 1}) {
		t.Errorf("Reconcile = %+v, %v; want the pod in sync and untouched", res, err)
	}

	writable()
	resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"})
	if err != nil || !resp.Existed {
		t.Fatalf("RemovePod once writable = %v, %v", resp, err)
	}
	if st := ts.look(t, ns); !st.untouched() || len(ts.records(t)) != 0 {
		t.Fatalf("capture (%+v) or record left after RemovePod", st)
	}
	if res, err := ts.pods.Reconcile(ctxT(t)); err != nil || res != (lifecycle.ReconcileResult{}) || !ts.look(t, ns).untouched() {
		t.Errorf("Reconcile after the release = %+v, %v; it must not restore capture", res, err)
	}
}

// TestInterruptedRemovePodIsFinished: a RemovePod that recorded its
// intent and then failed or died is finished by reconcile, which releases
// the pod instead of restoring its capture.
func TestInterruptedRemovePodIsFinished(t *testing.T) {
	onEngines(t, testInterruptedRemovePodIsFinished)
}

func testInterruptedRemovePodIsFinished(t *testing.T, w *world) {
	ts := startServer(t, true, withWorld(w))
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-1", ns)
	rec, err := ts.pods.Store().Get("pod-1")
	if err != nil || rec == nil {
		t.Fatalf("record: %v, %v", rec, err)
	}
	rec.Removing = true // what the store holds after a crash past the intent
	if err := ts.pods.Store().Put(rec); err != nil {
		t.Fatal(err)
	}
	if got := ts.get(t, "pod-1"); !strings.Contains(got.Detail, "RemovePod of the pod did not finish") {
		t.Errorf("GetPod of a pod being removed: %q", got.Detail)
	}
	res, err := ts.pods.Reconcile(ctxT(t))
	if err != nil || res != (lifecycle.ReconcileResult{Released: 1}) {
		t.Fatalf("Reconcile = %+v, %v; want one release", res, err)
	}
	if st := ts.look(t, ns); !st.untouched() || len(ts.records(t)) != 0 {
		t.Fatalf("capture (%+v) or record left after reconcile finished the removal", st)
	}
	ts.mustAdd(t, "pod-2", ns) // the namespace is free again
}

// TestFailedRemovePodIsFinishedLater: a RemovePod whose engine work fails
// keeps the pod's record, marked as being removed and its capture in
// place, so that neither a repeat nor reconcile restores it: the repeat
// finishes the release.
func TestFailedRemovePodIsFinishedLater(t *testing.T) {
	for _, finish := range []string{"repeat", "reconcile"} {
		t.Run(finish, func(t *testing.T) {
			w := fakeWorld(t)
			ts := startServer(t, true, withWorld(w))
			ns := ts.newNS(t)
			ts.mustAdd(t, "pod-1", ns)
			w.fake.FailNext(capturetest.OpRemove, errInjected)
			if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); status.Code(err) != codes.Internal {
				t.Fatalf("RemovePod with a failing engine: %v, want Internal", err)
			}
			if rec, _ := ts.pods.Store().Get("pod-1"); rec == nil || !rec.Removing {
				t.Fatalf("record after the failed RemovePod: %+v; want it kept, marked as being removed", rec)
			}
			if st := ts.look(t, ns); !st.captured() {
				t.Errorf("the failed RemovePod changed the namespace: %+v", st)
			}
			if got := ts.get(t, "pod-1"); !strings.Contains(got.Detail, "RemovePod of the pod did not finish") {
				t.Errorf("GetPod after the failed RemovePod: %q", got.Detail)
			}
			switch finish {
			case "repeat":
				resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"})
				if err != nil || !resp.Existed {
					t.Fatalf("repeated RemovePod = %v, %v", resp, err)
				}
			case "reconcile":
				if res, err := ts.pods.Reconcile(ctxT(t)); err != nil || res != (lifecycle.ReconcileResult{Released: 1}) {
					t.Fatalf("Reconcile = %+v, %v; want one release", res, err)
				}
			}
			if st := ts.look(t, ns); !st.untouched() || len(ts.records(t)) != 0 {
				t.Errorf("after the %s: namespace holds %+v, %d records; want nothing", finish, st, len(ts.records(t)))
			}
		})
	}
}
