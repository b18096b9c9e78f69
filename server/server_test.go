package server

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

func TestAddGetRemove(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		pod := ts.mustAdd(t, "pod-1", ns)
		if pod.PodUid != "pod-1" || pod.NetnsPath != ns || pod.NetnsId == "" || pod.EnrolledAt == nil {
			t.Errorf("reply lacks the record: %v", pod)
		}
		if o := pod.Options; o.GetCaptureMode() != nftredirv1.CaptureMode_CAPTURE_MODE_TPROXY || o.DnsCapture == nil || !o.GetIpv6() || !o.GetInboundCapture() {
			t.Errorf("effective options not filled in: %v", o)
		}
		if st := ts.look(t, ns); !st.captured() {
			t.Fatalf("after AddPod the pod namespace holds %+v; want our table, two fwmark rules and two routes", st)
		}
		got := ts.get(t, "pod-1")
		if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Fatalf("GetPod = %v (%s), want IN_SYNC", got.SyncStatus, got.Detail)
		}
		if !strings.Contains(got.LiveRuleset, "table inet nftredir") || !proto.Equal(got.Pod, pod) {
			t.Errorf("GetPod: live ruleset %q, pod %v", got.LiveRuleset, got.Pod)
		}
		list, err := ts.api.ListPods(ctxT(t), &nftredirv1.ListPodsRequest{})
		if err != nil || len(list.Pods) != 1 || list.Pods[0].PodUid != "pod-1" {
			t.Fatalf("ListPods = %v, %v", list, err)
		}

		for i, want := range []bool{true, false} {
			resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"})
			if err != nil || resp.Existed != want {
				t.Fatalf("RemovePod #%d = %v, %v; want existed=%v", i+1, resp, err, want)
			}
		}
		if st := ts.look(t, ns); !st.untouched() {
			t.Errorf("after RemovePod the namespace holds %+v; want no table, rule or route of ours", st)
		}
		if _, err := ts.api.GetPod(ctxT(t), &nftredirv1.GetPodRequest{PodUid: "pod-1"}); status.Code(err) != codes.NotFound {
			t.Errorf("GetPod after RemovePod: %v, want NotFound", err)
		}
		if len(ts.records(t)) != 0 {
			t.Error("record left after RemovePod")
		}
	})
}

func TestAddPodIdempotent(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		first := ts.mustAdd(t, "pod-1", ns)
		before := ts.look(t, ns)
		dump := w.Dump(t, ns)
		second := ts.mustAdd(t, "pod-1", ns)
		if !first.EnrolledAt.AsTime().Equal(second.EnrolledAt.AsTime()) {
			t.Errorf("enrolled_at changed on a repeat: %v -> %v", first.EnrolledAt.AsTime(), second.EnrolledAt.AsTime())
		}
		if again := w.Dump(t, ns); again != dump {
			t.Errorf("a repeat AddPod changed the namespace:\n%s\n---\n%s", dump, again)
		}
		if after := ts.look(t, ns); after != before || !after.captured() {
			t.Errorf("a repeat AddPod left %+v, before it %+v; want one table, rule and route each, unchanged", after, before)
		}
		// Changed options re-apply.
		_, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "pod-1", NetnsPath: ns,
			Options: &nftredirv1.RedirectOptions{ExcludeInboundPorts: []uint32{15021}}})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(ts.look(t, ns).table, "15021") {
			t.Error("changed options were not applied")
		}
		if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Errorf("after re-apply: %v %s", got.SyncStatus, got.Detail)
		}
	})
}

func TestRemovePodAfterNetnsDeleted(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		w.DeleteNamespace(t, ns)
		if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE {
			t.Errorf("GetPod after the netns went: %v", got.SyncStatus)
		}
		resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"})
		if err != nil || !resp.Existed {
			t.Fatalf("RemovePod = %v, %v", resp, err)
		}
		if len(ts.records(t)) != 0 {
			t.Error("record left")
		}
	})
}

// TestHostilePathsChangeNothing is about the kernel: the guard's checks
// on what the real paths open, and the node's own namespace never
// programmed. TestRefusedPathsChangeNothing holds the same refusals at
// the level of the engine's errors.
func TestHostilePathsChangeNothing(t *testing.T) {
	ts := startServer(t, true, withWorld(kernelWorld(t)))
	dir := t.TempDir()
	symlink := filepath.Join(dir, "host-link")
	if err := os.Symlink("/proc/self/ns/net", symlink); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want codes.Code
	}{
		{"/proc/1/ns/net", codes.FailedPrecondition},
		{"/proc/self/ns/net", codes.FailedPrecondition},
		{"/proc/" + strconv.Itoa(os.Getpid()) + "/ns/net", codes.FailedPrecondition},
		{symlink, codes.FailedPrecondition},
		{regular, codes.FailedPrecondition},
		{fifo, codes.FailedPrecondition},
		{dir, codes.FailedPrecondition},
		{"/dev/null", codes.FailedPrecondition},
		{"/proc/self/ns/mnt", codes.FailedPrecondition},
		{"/run/netns/nftr-s-does-not-exist", codes.FailedPrecondition},
		{"", codes.InvalidArgument},
		{"run/netns/x", codes.InvalidArgument},
		{"/run/netns/../netns/x", codes.InvalidArgument},
	}
	for _, tt := range tests {
		_, err := ts.add(t, "hostile", tt.path)
		if status.Code(err) != tt.want {
			t.Errorf("AddPod %q: %v, want %v", tt.path, err, tt.want)
		}
	}
	if n := len(ts.records(t)); n != 0 {
		t.Errorf("%d records after hostile requests", n)
	}
	if hostHasTable(t) {
		t.Fatal("the test's own namespace got an nftredir table")
	}
	if out := run(t, "ip", "rule", "show"); strings.Contains(out, "lookup 100") {
		t.Errorf("the host got a fwmark rule:\n%s", out)
	}
}

// TestRefusedPathsChangeNothing: every refusal of the path, whichever
// check of the guard it stands for, has its code, programs nothing
// anywhere, records nothing and leaves no namespace open.
func TestRefusedPathsChangeNothing(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w))
	f := w.fake
	f.AddHost("/run/netns/host-bound")
	f.SetOpenError("/run/netns/no-access", fmt.Errorf("open /run/netns/no-access: %w", netns.ErrNoAccess))
	f.SetOpenError("/run/netns/hung", fmt.Errorf("open /run/netns/hung: %w", netns.ErrTimeout))
	tests := []struct {
		path string
		want codes.Code
	}{
		{capturetest.HostPaths[0], codes.FailedPrecondition},
		{capturetest.HostPaths[1], codes.FailedPrecondition},
		{"/run/netns/host-bound", codes.FailedPrecondition},
		{w.NotNamespace(t), codes.FailedPrecondition},
		{"/run/netns/does-not-exist", codes.FailedPrecondition},
		{"/run/netns/no-access", codes.FailedPrecondition},
		{"/run/netns/hung", codes.Unavailable},
		{"", codes.InvalidArgument},
		{"run/netns/x", codes.InvalidArgument},
		{"/run/netns/../netns/x", codes.InvalidArgument},
	}
	changes := f.Changes()
	for _, tt := range tests {
		_, err := ts.add(t, "hostile", tt.path)
		if status.Code(err) != tt.want {
			t.Errorf("AddPod %q: %v, want %v", tt.path, err, tt.want)
		}
	}
	if n := len(ts.records(t)); n != 0 {
		t.Errorf("%d records after hostile requests", n)
	}
	if got := f.Changes(); got != changes {
		t.Errorf("refused requests made %d changes to namespaces", got-changes)
	}
	if got := w.Dump(t, capturetest.HostPaths[0]); got != "" {
		t.Errorf("the node's namespace holds:\n%s", got)
	}
	if n := f.OpenNamespaces(); n != 0 {
		t.Errorf("%d namespaces left open", n)
	}
	ts.mustAdd(t, "fine", ts.newNS(t)) // the refusals held nothing
}

func TestTamperIsReportedAndRepaired(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		ts.mustAdd(t, "pod-1", ns)
		rs := ruleset(t, ts, "pod-1")

		w.DeleteTable(t, ns)
		got := ts.get(t, "pod-1")
		if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_ABSENT || !strings.Contains(got.Detail, "missing") {
			t.Fatalf("after deleting the table: %v %q", got.SyncStatus, got.Detail)
		}
		res, err := ts.pods.Reconcile(ctxT(t))
		if err != nil || res.Repaired != 1 {
			t.Fatalf("Reconcile = %+v, %v; want one repair", res, err)
		}
		if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Fatalf("after repair: %v %q", got.SyncStatus, got.Detail)
		}

		w.AddForeignRule(t, ns, rs)
		if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED {
			t.Fatalf("after adding a rule: %v %q", got.SyncStatus, got.Detail)
		}
		w.DeleteRule(t, ns, netns.DefaultRouting(), unix.AF_INET)
		got = ts.get(t, "pod-1")
		if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED || !strings.Contains(got.Detail, "IPv4 fwmark rule") {
			t.Fatalf("after deleting the rule: %v %q", got.SyncStatus, got.Detail)
		}
		res, err = ts.pods.Reconcile(ctxT(t))
		if err != nil || res.Repaired != 1 {
			t.Fatalf("Reconcile = %+v, %v; want one repair", res, err)
		}
		if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Fatalf("after second repair: %v %q", got.SyncStatus, got.Detail)
		}
		if st := ts.look(t, ns); !st.captured() {
			t.Errorf("after the repairs the namespace holds %+v", st)
		}
		res, _ = ts.pods.Reconcile(ctxT(t))
		if res != (lifecycle.ReconcileResult{InSync: 1}) {
			t.Errorf("third reconcile = %+v, want all in sync", res)
		}
	})
}

// ruleset is the ruleset the pod's record asks for.
func ruleset(t *testing.T, ts *testServer, uid string) *nft.Ruleset {
	t.Helper()
	rec, err := ts.pods.Store().Get(uid)
	if err != nil || rec == nil {
		t.Fatalf("record of %s: %v, %v", uid, rec, err)
	}
	rs, err := rec.Ruleset()
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestReconcileDropsReplacedNamespace(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns, gone := ts.newNS(t), ts.newNS(t)
		ts.mustAdd(t, "replaced", ns)
		ts.mustAdd(t, "gone", gone)
		// Hold the old namespace open so the new one cannot reuse its inode.
		old, err := w.Engine().Open(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		w.ReplaceNamespace(t, ns)
		w.DeleteNamespace(t, gone)

		got := ts.get(t, "replaced")
		if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE || !strings.Contains(got.Detail, "now names namespace") {
			t.Errorf("GetPod of a replaced namespace: %v %q", got.SyncStatus, got.Detail)
		}
		res, err := ts.pods.Reconcile(ctxT(t))
		if err != nil || res.Dropped != 2 || res.Repaired != 0 {
			t.Fatalf("Reconcile = %+v, %v; want two drops", res, err)
		}
		if st := ts.look(t, ns); !st.untouched() {
			t.Fatalf("the namespace now at the old path was programmed: %+v", st)
		}
		if len(ts.records(t)) != 0 {
			t.Error("records survived")
		}
		// The path names a fresh namespace: enrolling it again works.
		ts.mustAdd(t, "replaced", ns)
	})
}

// TestReconcileDropsNamespaceWithReusedInode: a namespace freed and
// replaced by one the kernel gave the same inode number is another
// namespace all the same; only its cookie tells them apart.
func TestReconcileDropsNamespaceWithReusedInode(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w))
	ns := ts.newNS(t)
	pod := ts.mustAdd(t, "pod-1", ns)
	id := w.fake.ReplaceReusingInode(ns)
	if old, err := netns.ParseID(pod.NetnsId); err != nil || !old.SameFile(id) || old == id {
		t.Fatalf("recorded %s (%v), now %s: want the same dev:ino, another cookie", pod.NetnsId, err, id)
	}
	if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE {
		t.Errorf("GetPod of a namespace reusing the inode: %v %q", got.SyncStatus, got.Detail)
	}
	changes := w.fake.Changes()
	res, err := ts.pods.Reconcile(ctxT(t))
	if err != nil || res != (lifecycle.ReconcileResult{Dropped: 1}) {
		t.Fatalf("Reconcile = %+v, %v; want one drop", res, err)
	}
	if st := ts.look(t, ns); !st.untouched() || w.fake.Changes() != changes {
		t.Errorf("the new namespace was programmed: %+v", st)
	}
}

func TestAddPodMovesToNewNamespace(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		a, b := ts.newNS(t), ts.newNS(t)
		ts.mustAdd(t, "pod-1", a)
		pod := ts.mustAdd(t, "pod-1", b)
		if pod.NetnsPath != b {
			t.Errorf("record still names %s", pod.NetnsPath)
		}
		if sa, sb := ts.look(t, a), ts.look(t, b); !sa.untouched() || !sb.captured() {
			t.Errorf("after the move: old namespace holds %+v, new %+v", sa, sb)
		}
		if rec, _ := ts.pods.Store().Get("pod-1"); rec == nil || rec.Leaving != nil {
			t.Errorf("record after the move: %+v; want the move finished", rec)
		}
		ts.mustAdd(t, "pod-2", a) // the old namespace is free
	})
}

// TestReconcileFinishesAnInterruptedMove: a daemon that died between
// recording a move and cleaning up the namespace left behind finds that
// namespace in the record and cleans it up on its next reconcile.
func TestReconcileFinishesAnInterruptedMove(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		a, b := ts.newNS(t), ts.newNS(t)
		pod := ts.mustAdd(t, "pod-1", a)
		// What the store holds at the crash: the move recorded, a still
		// carrying the pod's table and rule.
		rec, err := ts.pods.Store().Get("pod-1")
		if err != nil || rec == nil {
			t.Fatalf("record: %v, %v", rec, err)
		}
		rec.Leaving = &state.Leaving{NetnsPath: a, NetnsID: pod.NetnsId, Routing: rec.Routing}
		rec.NetnsPath, rec.NetnsID = b, w.id(t, b).String()
		if err := ts.pods.Store().Put(rec); err != nil {
			t.Fatal(err)
		}
		if _, err := ts.pods.Reconcile(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if sa, sb := ts.look(t, a), ts.look(t, b); !sa.untouched() || !sb.captured() {
			t.Errorf("after reconcile: left namespace holds %+v, new one %+v; want nothing, the capture", sa, sb)
		}
		if rec, _ := ts.pods.Store().Get("pod-1"); rec == nil || rec.Leaving != nil {
			t.Errorf("record after reconcile: %+v; want the move marked finished", rec)
		}
		ts.mustAdd(t, "pod-2", a) // the left namespace is free again
	})
}

func TestNamespaceBelongsToOnePod(t *testing.T) {
	onEngines(t, func(t *testing.T, w *world) {
		ts := startServer(t, true, withWorld(w))
		ns := ts.newNS(t)
		ts.mustAdd(t, "owner", ns)
		dump := w.Dump(t, ns)
		_, err := ts.add(t, "intruder", ns)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"owner"`) {
			t.Fatalf("second pod on one namespace: %v", err)
		}
		if len(ts.records(t)) != 1 {
			t.Error("the intruder got a record")
		}
		if again := w.Dump(t, ns); again != dump {
			t.Errorf("the refused intruder changed the namespace:\n%s\n---\n%s", dump, again)
		}
		if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "owner"}); err != nil {
			t.Fatal(err)
		}
		ts.mustAdd(t, "intruder", ns) // free again
	})
}

// TestBusyOwnerKeepsItsNamespace: while the owning pod has a call in
// progress it may be moving out of the namespace, its record already
// naming the new one but its cleanup here still to come. A newcomer must
// wait, or that cleanup would remove the newcomer's rules.
func TestBusyOwnerKeepsItsNamespace(t *testing.T) {
	// The owner is kept busy by a GetPod of its own, held inside the
	// engine's comparison, under the owner's lock.
	inInspect, release := make(chan struct{}), make(chan struct{})
	var hold atomic.Bool
	hook := &hookEngine{beforeInspect: func() {
		if hold.CompareAndSwap(true, false) {
			close(inInspect)
			<-release
		}
	}}
	ts := startServer(t, true, withHooks(hook))
	let := releaseAtCleanup(t, release)
	ns := ts.newNS(t)
	ts.mustAdd(t, "owner", ns)
	hold.Store(true)
	got := make(chan error, 1)
	go func() {
		_, err := ts.api.GetPod(context.Background(), &nftredirv1.GetPodRequest{PodUid: "owner"})
		got <- err
	}()
	<-inInspect
	// Mid-move, as far as this namespace is concerned: no record names it.
	if err := ts.pods.Store().Delete("owner"); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.add(t, "newcomer", ns); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("AddPod while the owner is busy: %v, want FailedPrecondition", err)
	}
	let()
	<-got
	ts.mustAdd(t, "newcomer", ns) // the owner is done and its record is gone
}

// TestFailedApplyChangesNothing: the table transaction fails after the
// routing went in, as a refused netlink batch does; the rollback takes
// the routing out again and drops the record.
func TestFailedApplyChangesNothing(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w))
	ns := ts.newNS(t)
	dump := w.Dump(t, ns)
	w.fake.FailNext(capturetest.OpApply, errInjected)
	if _, err := ts.add(t, "doomed", ns); status.Code(err) != codes.Internal {
		t.Fatalf("AddPod with a failing engine: %v", err)
	}
	if len(ts.records(t)) != 0 {
		t.Error("a failed AddPod left a record")
	}
	if st := ts.look(t, ns); !st.untouched() || w.Dump(t, ns) != dump {
		t.Errorf("a failed AddPod left %+v in the namespace:\n%s", st, w.Dump(t, ns))
	}
	if n := w.fake.OpenNamespaces(); n != 0 {
		t.Errorf("%d namespaces left open", n)
	}
	ts.mustAdd(t, "other", ns) // the namespace was not claimed
}

// TestFailedApplyAndFailedRollbackLeaveNoRouting: when the table of a new
// pod is refused after its routing went in, and taking the table out in
// the rollback fails too, the routing still goes: no record is left that
// would ever remove it.
func TestFailedApplyAndFailedRollbackLeaveNoRouting(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w))
	ns := ts.newNS(t)
	dump := w.Dump(t, ns)
	w.fake.FailNext(capturetest.OpApply, errInjected)
	w.fake.FailNext(capturetest.OpRemove, errInjected)
	if _, err := ts.add(t, "doomed", ns); status.Code(err) != codes.Internal {
		t.Fatalf("AddPod with a failing engine: %v", err)
	}
	if st := ts.look(t, ns); !st.untouched() || w.Dump(t, ns) != dump {
		t.Errorf("a failed AddPod whose rollback could not remove the table left %+v:\n%s", st, w.Dump(t, ns))
	}
}

// TestFailedReapplyKeepsThePreviousEnrolment: an AddPod with new options
// for an enrolled pod that fails leaves the pod as it was: its record,
// its table and its routing.
func TestFailedReapplyKeepsThePreviousEnrolment(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w))
	ns := ts.newNS(t)
	pod := ts.mustAdd(t, "pod-1", ns)
	dump := w.Dump(t, ns)
	w.fake.FailNext(capturetest.OpApply, errInjected)
	_, err := ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "pod-1", NetnsPath: ns,
		Options: &nftredirv1.RedirectOptions{ExcludeInboundPorts: []uint32{15021}}})
	if status.Code(err) != codes.Internal {
		t.Fatalf("failing re-apply: %v", err)
	}
	if again := w.Dump(t, ns); again != dump {
		t.Errorf("a failed re-apply changed the namespace:\n%s\n---\n%s", dump, again)
	}
	got := ts.get(t, "pod-1")
	if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC || !proto.Equal(got.Pod, pod) {
		t.Errorf("after the failed re-apply: %v %q, pod %v; want the previous enrolment in sync", got.SyncStatus, got.Detail, got.Pod)
	}
}

// TestFailedMoveStaysInTheOldNamespace: a move whose Apply fails in the
// new namespace leaves the pod enrolled, and captured, where it was, and
// nothing of it in the new one.
func TestFailedMoveStaysInTheOldNamespace(t *testing.T) {
	w := fakeWorld(t)
	ts := startServer(t, true, withWorld(w))
	a, b := ts.newNS(t), ts.newNS(t)
	pod := ts.mustAdd(t, "pod-1", a)
	w.fake.FailNext(capturetest.OpApply, errInjected)
	if _, err := ts.add(t, "pod-1", b); status.Code(err) != codes.Internal {
		t.Fatalf("failing move: %v", err)
	}
	if sa, sb := ts.look(t, a), ts.look(t, b); !sa.captured() || !sb.untouched() {
		t.Errorf("after the failed move: old namespace holds %+v, new %+v; want the capture, nothing", sa, sb)
	}
	got := ts.get(t, "pod-1")
	if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC || got.Pod.GetNetnsPath() != a || got.Pod.GetNetnsId() != pod.NetnsId {
		t.Errorf("after the failed move: %v, pod %v; want enrolled in %s", got.SyncStatus, got.Pod, a)
	}
	if rec, _ := ts.pods.Store().Get("pod-1"); rec == nil || rec.Leaving != nil {
		t.Errorf("record after the failed move: %+v; want no move pending", rec)
	}
	ts.mustAdd(t, "pod-2", b) // the new namespace was released
}

func TestPanicIsInternalAndServerKeepsServing(t *testing.T) {
	hook := &hookEngine{beforeApply: func(rs *nft.Ruleset) {
		if rs.Spec.PodID == "boom" {
			panic("injected panic")
		}
	}}
	ts := startServer(t, true, withHooks(hook))
	ns, ns2 := ts.newNS(t), ts.newNS(t)
	_, err := ts.add(t, "boom", ns)
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "goroutine") || strings.Contains(err.Error(), "injected") {
		t.Fatalf("panicking AddPod: %v; want Internal without details", err)
	}
	if !strings.Contains(ts.logs.String(), "injected panic") || !strings.Contains(ts.logs.String(), "goroutine") {
		t.Error("the panic and its stack are not in the log")
	}
	if st := ts.look(t, ns); len(ts.records(t)) != 0 || !st.untouched() {
		t.Errorf("a panicking AddPod left a record or %+v", st)
	}
	ts.mustAdd(t, "fine", ns2)
	ts.mustAdd(t, "boom-free", ns) // the lock and the claim were released
}

func TestHealthTurnsServingAfterStartupReconcile(t *testing.T) {
	w := fakeWorld(t)
	state := filepath.Join(t.TempDir(), "pods")
	first := startServer(t, true, withWorld(w), withStateDir(state))
	first.mustAdd(t, "pod-1", first.newNS(t))
	first.stop()

	entered, release := make(chan struct{}), make(chan struct{})
	hook := &hookEngine{beforeInspect: func() {
		select {
		case <-entered:
		default:
			close(entered)
			<-release
		}
	}}
	ts := startServer(t, false, withWorld(w), withStateDir(state), withHooks(hook))
	let := releaseAtCleanup(t, release)
	<-entered // the startup reconcile is running
	for _, svc := range []string{"", nftredirv1.ServiceName} {
		resp, err := ts.health.Check(ctxT(t), &healthgrpc.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthgrpc.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health %q during startup = %v, %v; want NOT_SERVING", svc, resp, err)
		}
	}
	if _, err := ts.api.ListPods(ctxT(t), &nftredirv1.ListPodsRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("ListPods during startup: %v, want Unavailable", err)
	}
	let()
	ts.waitServing(t)
	resp, err := ts.health.Check(ctxT(t), &healthgrpc.HealthCheckRequest{})
	if err != nil || resp.Status != healthgrpc.HealthCheckResponse_SERVING {
		t.Fatalf("overall health = %v, %v", resp, err)
	}
	if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("pod after restart: %v", got.SyncStatus)
	}
}

func TestWatchPods(t *testing.T) {
	ts := startServer(t, true)
	a, b := ts.newNS(t), ts.newNS(t)
	ts.mustAdd(t, "pod-a", a)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	w, err := ts.api.WatchPods(ctx, &nftredirv1.WatchPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(ev nftredirv1.EventType, uid string) {
		t.Helper()
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if m.Event != ev || m.GetPod().GetPodUid() != uid {
			t.Fatalf("got %v %q, want %v %q", m.Event, m.GetPod().GetPodUid(), ev, uid)
		}
	}
	expect(nftredirv1.EventType_EVENT_TYPE_ADDED, "pod-a")
	expect(nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE, "")
	ts.mustAdd(t, "pod-b", b)
	expect(nftredirv1.EventType_EVENT_TYPE_ADDED, "pod-b")
	ts.mustAdd(t, "pod-b", b) // unchanged: no event
	if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-a"}); err != nil {
		t.Fatal(err)
	}
	expect(nftredirv1.EventType_EVENT_TYPE_REMOVED, "pod-a")
	// Stopping the daemon ends the watch with Unavailable.
	ts.stop()
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("watch after stop: %v, want Unavailable", err)
	}
}

func TestPeerCredentialDenial(t *testing.T) {
	nstest.RequirePrivileged(t)
	// The helper runs as nobody: it needs a binary and a socket it can reach.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(openDir(t), "server.test")
	copyFile(t, exe, bin)

	for _, tc := range []struct {
		name   string
		opt    serverOpt
		groups []uint32
		want   string
	}{
		{"not allowed", func(*testConfig) {}, nil, "PermissionDenied|caller uid 65534 gid 65534 is not allowed; start nftredird with --allow-uid/--allow-gid"},
		{"uid allowed", func(c *testConfig) { c.AllowUIDs = []uint32{65534} }, nil, "OK|"},
		{"gid allowed", func(c *testConfig) { c.AllowGIDs = []uint32{65534} }, nil, "OK|"},
		{"supplementary group allowed", func(c *testConfig) { c.AllowGIDs = []uint32{4245} }, []uint32{4245}, "OK|"},
		{"other supplementary group", func(c *testConfig) { c.AllowGIDs = []uint32{4245} }, []uint32{4246}, "PermissionDenied|caller uid 65534 gid 65534 is not allowed; start nftredird with --allow-uid/--allow-gid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, true, tc.opt)
			for _, p := range []string{filepath.Dir(ts.dir), ts.dir} {
				if err := os.Chmod(p, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(ts.socket, 0o666); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), dialEnv+"="+ts.socket)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: tc.groups}}
			cmd.Stderr = io.Discard
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Fatalf("unprivileged ListPods = %q, want %q", got, tc.want)
			}
		})
	}
}

// openDir is a temp dir that other users can traverse.
func openDir(t *testing.T) string {
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPodsDoNotWaitForEachOther(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	hook := &hookEngine{beforeApply: func(rs *nft.Ruleset) {
		if rs.Spec.PodID == "slow" {
			close(entered)
			<-release
		}
	}}
	ts := startServer(t, true, withHooks(hook))
	let := releaseAtCleanup(t, release)
	slowNS, fastNS := ts.newNS(t), ts.newNS(t)
	slowDone := make(chan error, 1)
	go func() {
		_, err := ts.add(t, "slow", slowNS)
		slowDone <- err
	}()
	<-entered // "slow" holds its lock, inside the engine's work
	// Another pod goes through while "slow" is held...
	ts.mustAdd(t, "fast", fastNS)
	// ...but a second call for "slow" waits for the first.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := ts.api.GetPod(ctx, &nftredirv1.GetPodRequest{PodUid: "slow"}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("GetPod while AddPod holds the pod: %v, want DeadlineExceeded", err)
	}
	let()
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	if got := ts.get(t, "slow"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("slow pod: %v", got.SyncStatus)
	}
}

func TestReflectionAndMessageLimit(t *testing.T) {
	ts := startServer(t, true)
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, nftredirv1.ServiceName) || !slices.Contains(names, "grpc.health.v1.Health") {
		t.Errorf("reflection lists %v", names)
	}
	_, err = ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: "big", NetnsPath: "/run/netns/x", PodName: strings.Repeat("x", MaxRecvMsgSize)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("oversized request: %v, want ResourceExhausted", err)
	}
}

// TestReconcileCountsFailuresAndRetries: a pod that cannot be inspected
// or repaired is counted as failed, keeps its record, and is repaired by
// the next pass.
func TestReconcileCountsFailuresAndRetries(t *testing.T) {
	for _, op := range []capturetest.Op{capturetest.OpInspect, capturetest.OpApply} {
		t.Run(string(op), func(t *testing.T) {
			w := fakeWorld(t)
			ts := startServer(t, true, withWorld(w))
			ns, other := ts.newNS(t), ts.newNS(t)
			ts.mustAdd(t, "pod-1", ns)
			ts.mustAdd(t, "pod-2", other)
			w.DeleteTable(t, ns)
			w.DeleteTable(t, other)
			w.fake.FailNext(op, errInjected)
			res, err := ts.pods.Reconcile(ctxT(t))
			if err != nil || res != (lifecycle.ReconcileResult{Repaired: 1, Failed: 1}) {
				t.Fatalf("Reconcile with one failing %s = %+v, %v; want one repaired, one failed", op, res, err)
			}
			if n := len(ts.records(t)); n != 2 {
				t.Errorf("%d records after the pass, want both kept", n)
			}
			if res, err := ts.pods.Reconcile(ctxT(t)); err != nil || res != (lifecycle.ReconcileResult{InSync: 1, Repaired: 1}) {
				t.Fatalf("next Reconcile = %+v, %v; want the failed pod repaired", res, err)
			}
			if a, b := ts.look(t, ns), ts.look(t, other); !a.captured() || !b.captured() {
				t.Errorf("after the retry: %+v and %+v; want both captured", a, b)
			}
		})
	}
}

// TestFailedReapplyWithNewRoutingChangesNothing: a pod enrolled before
// the daemon's routing flags changed is re-applied with the new routing;
// when that Apply fails after installing the new routing, as a refused
// table batch does, the rollback takes the new routing out again and
// leaves the recorded one.
func TestFailedReapplyWithNewRoutingChangesNothing(t *testing.T) {
	other, shared := netns.DefaultRouting(), netns.DefaultRouting()
	other.Table, other.Priority = 101, 32000
	shared.Priority = 32000
	for _, moved := range []netns.Routing{other, shared} {
		t.Run(fmt.Sprintf("table %d priority %d", moved.Table, moved.Priority), func(t *testing.T) {
			w := fakeWorld(t)
			dir := filepath.Join(t.TempDir(), "pods")
			first := startServer(t, true, withWorld(w), withStateDir(dir))
			ns := first.newNS(t)
			first.mustAdd(t, "pod-1", ns)
			first.stop()

			ts := startServer(t, true, withWorld(w), withStateDir(dir), func(c *testConfig) { c.Pods.RouteTable, c.Pods.RulePriority = moved.Table, moved.Priority })
			dump := w.Dump(t, ns)
			w.fake.FailNext(capturetest.OpApply, errInjected)
			if _, err := ts.add(t, "pod-1", ns); status.Code(err) != codes.Internal {
				t.Fatalf("failing re-apply: %v", err)
			}
			if again := w.Dump(t, ns); again != dump {
				t.Errorf("a failed re-apply changed the namespace:\n%s\n---\n%s", dump, again)
			}
			if got := ts.get(t, "pod-1"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
				t.Errorf("after the failed re-apply: %v %q", got.SyncStatus, got.Detail)
			}
			// Once it succeeds, the pod has the new routing only.
			ts.mustAdd(t, "pod-1", ns)
			if rt := w.fake.Routing(ns, moved); !rt.Complete() {
				t.Errorf("new routing after the re-apply: %+v", rt)
			}
			if rt := w.fake.Routing(ns, netns.DefaultRouting()); rt.V4Rule || rt.V6Rule {
				t.Errorf("old rules left after the re-apply: %+v", rt)
			}
		})
	}
}
