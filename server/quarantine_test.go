package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// corrupt overwrites uid's record in the state dir with what damage(the
// record's bytes) returns.
func (ts *testServer) corrupt(t *testing.T, uid string, damage func([]byte) []byte) {
	t.Helper()
	path := ts.pods.Store().RecordPath(uid)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, damage(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// truncateAfter cuts the record just after the field key, as a torn
// write would, leaving what comes before readable.
func truncateAfter(key string) func([]byte) []byte {
	return func(data []byte) []byte {
		i := strings.Index(string(data), `"`+key+`"`)
		j := strings.IndexByte(string(data[i:]), '\n')
		return data[:i+j+1]
	}
}

// TestQuarantinedPodIsReleased: a pod whose record is corrupt, however
// badly, is released by RemovePod: its table and routing go.
func TestQuarantinedPodIsReleased(t *testing.T) {
	onEngines(t, testQuarantinedPodIsReleased)
}

func testQuarantinedPodIsReleased(t *testing.T, w *world) {
	for _, tc := range []struct {
		name    string
		damage  func([]byte) []byte
		restart bool
	}{
		{"torn after the netns id", truncateAfter("netnsId"), false},
		{"torn, set aside at a restart", truncateAfter("netnsId"), true},
		{"invalid spec", func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"mode": "TPROXY"`, `"mode": "SIDEWAYS"`, 1))
		}, false},
		{"path of the wrong type", func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"netnsPath": "`, `"netnsPath": 7, "x": "`, 1))
		}, false},
		{"garbage", func([]byte) []byte { return []byte("{not json") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "pods")
			ts := startServer(t, true, withWorld(w), withStateDir(state))
			ns := ts.newNS(t)
			ts.mustAdd(t, "pod-1", ns)
			ts.corrupt(t, "pod-1", tc.damage)
			if tc.restart {
				ts.stop()
				ts = startServer(t, true, withWorld(w), withStateDir(state))
			}
			resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"})
			if err != nil || !resp.Existed {
				t.Fatalf("RemovePod = %v, %v; want existed=true\nserver log:\n%s", resp, err, ts.logs.String())
			}
			if st := ts.look(t, ns); st.table != "" {
				t.Errorf("the table stayed after RemovePod of a pod with a corrupt record\nserver log:\n%s", ts.logs.String())
			} else if !st.untouched() {
				t.Errorf("the routing stayed after RemovePod of a pod with a corrupt record: %+v", st)
			}
			// Released once: a repeat has nothing to do.
			if resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil || resp.Existed {
				t.Errorf("second RemovePod = %v, %v; want existed=false", resp, err)
			}
			ts.mustAdd(t, "pod-2", ns) // the namespace is free
		})
	}
}

// TestQuarantinedRecordTouchesOnlyItsPod: a damaged record that names
// another pod's namespace never removes that pod's capture.
func TestQuarantinedRecordTouchesOnlyItsPod(t *testing.T) {
	onEngines(t, testQuarantinedRecordTouchesOnlyItsPod)
}

func testQuarantinedRecordTouchesOnlyItsPod(t *testing.T, w *world) {
	ts := startServer(t, true, withWorld(w))
	victim, mine := ts.newNS(t), ts.newNS(t)
	ts.mustAdd(t, "victim", victim)
	ts.mustAdd(t, "pod-1", mine)
	before := w.Dump(t, victim)
	ts.pods.Store().Delete("pod-1")
	// pod-1's record, torn, naming the victim's namespace.
	path := ts.pods.Store().RecordPath("pod-1")
	if err := os.WriteFile(path, []byte(`{"version": 1, "podUid": "pod-1", "netnsPath": "`+victim+`", "netnsId": "`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatal(err)
	}
	if st := ts.look(t, victim); !st.captured() || w.Dump(t, victim) != before {
		t.Fatalf("RemovePod of a damaged record changed another pod's capture: %+v", st)
	}
	if got := ts.get(t, "victim"); got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("victim after the release: %v %q", got.SyncStatus, got.Detail)
	}
}

// TestQuarantinedRecordIsShown: until its pod is released, a quarantined
// record is in ListPods and GetPod, with the namespace it names.
func TestQuarantinedRecordIsShown(t *testing.T) {
	ts := startServer(t, true)
	ns := ts.newNS(t)
	pod := ts.mustAdd(t, "pod-1", ns)
	ts.corrupt(t, "pod-1", truncateAfter("netnsId"))

	got := ts.get(t, "pod-1")
	if got.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_QUARANTINED || got.Pod.GetNetnsPath() != ns || got.Pod.GetNetnsId() != pod.NetnsId ||
		!strings.Contains(got.Detail, "RemovePod releases it") {
		t.Errorf("GetPod of a quarantined pod = %v", got)
	}
	if !strings.Contains(ts.logs.String(), "corrupt record moved to quarantine") {
		t.Error("no log line for the quarantine")
	}
	list, err := ts.api.ListPods(ctxT(t), &nftredirv1.ListPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Pods) != 0 || len(list.Quarantined) != 1 {
		t.Fatalf("ListPods = %v; want no pods and one quarantined record", list)
	}
	q := list.Quarantined[0]
	if q.PodUid != "pod-1" || q.NetnsPath != ns || q.NetnsId != pod.NetnsId || !strings.Contains(q.Reason, "corrupt record") ||
		!strings.HasPrefix(q.File, filepath.Join(ts.pods.Store().Dir(), state.QuarantineDir)) {
		t.Errorf("quarantined record = %v", q)
	}
	if _, err := os.Stat(q.File); err != nil {
		t.Errorf("quarantined file: %v", err)
	}

	if _, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatal(err)
	}
	if list, err := ts.api.ListPods(ctxT(t), &nftredirv1.ListPodsRequest{}); err != nil || len(list.Quarantined) != 0 {
		t.Errorf("ListPods after the release = %v, %v; want nothing quarantined", list, err)
	}
	if _, err := os.Stat(q.File + state.ReleasedSuffix); err != nil {
		t.Errorf("the released record is not kept for inspection: %v", err)
	}
}
