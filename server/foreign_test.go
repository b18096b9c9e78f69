package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestForeignCaptureOverTheAPI: a namespace holding istio-cni's in-pod
// rules is refused with FailedPrecondition naming them, and left as it
// was, unless the engine takes over: then AddPod succeeds and only our
// capture is left. On the Fake and on the kernel.
func TestForeignCaptureOverTheAPI(t *testing.T) {
	t.Run("refused", testForeignRefused)
	t.Run("taken", testForeignTakenOver)
	t.Run("refused beside its routing", testRefusedBesideForeignRouting)
}

// istio-cni's policy routing is byte-equal to ours by default. A refused
// AddPod, and each retry of it, leaves that routing where it is: taking it
// out would break the other agent's inbound tproxy and its proxy's
// mark-routed replies. So does an AddPod whose table batch fails beside
// another agent's routing (take-over on), and a refusal of legacy rules.
func testRefusedBesideForeignRouting(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		cases := []struct {
			name    string
			setup   func(ns string)
			code    codes.Code
			message string
		}{
			{"iptables-nft chains", func(ns string) { w.AddForeignCapture(t, ns) }, codes.FailedPrecondition, "ISTIO_OUTPUT"},
			{"legacy rules", func(ns string) { w.AddLegacyCapture(t, ns) }, codes.FailedPrecondition, "legacy"},
		}
		if w.fake != nil {
			cases = append(cases, struct {
				name    string
				setup   func(ns string)
				code    codes.Code
				message string
			}{"a failed table batch", func(string) { w.fake.FailNext(capturetest.OpApply, errInjected) }, codes.Internal, errInjected.Error()})
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				ns := ts.newNS(t)
				w.AddRouting(t, ns, netns.DefaultRouting())
				c.setup(ns)
				before := w.Dump(t, ns)
				for try := 1; try <= 3; try++ {
					_, err := ts.add(t, "beside-"+strings.ReplaceAll(c.name, " ", "-"), ns)
					if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.message) {
						t.Fatalf("try %d: AddPod = %v; want %v naming %q", try, err, c.code, c.message)
					}
					if got := w.Dump(t, ns); got != before {
						t.Fatalf("try %d changed the namespace\n--- before\n%s\n--- after\n%s", try, before, got)
					}
					if c.name == "a failed table batch" && try < 3 {
						w.fake.FailNext(capturetest.OpApply, errInjected)
					}
				}
				if n := len(ts.records(t)); n != 0 {
					t.Errorf("%d records after refusals", n)
				}
			})
		}
	})
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
