package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestForeignCaptureOverTheAPI: a namespace holding istio-cni's in-pod
// rules is refused with FailedPrecondition naming them, and left as it
// was, unless the engine takes over: then AddPod succeeds and only our
// capture is left. On the Fake and on the kernel.
func TestForeignCaptureOverTheAPI(t *testing.T) {
	t.Run("refused", testForeignRefused)
	t.Run("taken", testForeignTakenOver)
}

func testForeignRefused(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		w.AddForeignCapture(t, ns)
		dump := w.Dump(t, ns)
		_, err := ts.add(t, "istio-pod", ns)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "ISTIO_OUTPUT") {
			t.Fatalf("AddPod over istio-cni's rules: %v; want FailedPrecondition naming ISTIO_OUTPUT", err)
		}
		t.Logf("refusal: %s", status.Convert(err).Message())
		if n := len(ts.records(t)); n != 0 {
			t.Errorf("%d records after a refusal", n)
		}
		if got := w.Dump(t, ns); got != dump {
			t.Errorf("refusal changed the namespace\n--- before\n%s\n--- after\n%s", dump, got)
		}
	})
}

func testForeignTakenOver(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		w.SetTakeOver(t, true)
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		w.AddForeignCapture(t, ns)
		ts.mustAdd(t, "istio-pod", ns)
		if st := ts.look(t, ns); !st.captured() {
			t.Errorf("after take-over: %+v", st)
		}
		if got := w.Dump(t, ns); strings.Contains(got, "ISTIO_") {
			t.Errorf("foreign capture left after take-over:\n%s", got)
		}

		// istio-cni puts its rules back beside ours: GetPod says so, and
		// reconcile takes them over again.
		w.AddForeignCapture(t, ns)
		if got := ts.get(t, "istio-pod"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED || !strings.Contains(got.Detail, "ISTIO_OUTPUT") {
			t.Fatalf("with istio-cni's rules back: %v %q", got.SyncStatus, got.Detail)
		}
		if res, err := ts.pods.Reconcile(ctxT(t)); err != nil || res.Repaired != 1 {
			t.Fatalf("Reconcile = %+v, %v; want one repair", res, err)
		}
		if got := ts.get(t, "istio-pod"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Errorf("after reconcile: %v %q", got.SyncStatus, got.Detail)
		}
		if got := w.Dump(t, ns); strings.Contains(got, "ISTIO_") {
			t.Errorf("foreign capture left after reconcile:\n%s", got)
		}
	})
}
