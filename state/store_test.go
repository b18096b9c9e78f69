package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

func testRecord(uid string) *Record {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return &Record{
		Version:    Version,
		PodUID:     uid,
		PodName:    "web-0",
		NetnsPath:  "/run/netns/" + uid,
		NetnsID:    "4:4026532591",
		PodIPs:     []string{"10.244.1.7"},
		Spec:       SpecOf(nft.DefaultSpec(uid)),
		Routing:    RoutingOf(netns.DefaultRouting()),
		EnrolledAt: now,
		UpdatedAt:  now,
	}
}

func TestStorePutGetDelete(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := st.Get("nope"); r != nil || err != nil {
		t.Fatalf("Get of unknown pod = %v, %v", r, err)
	}
	rec := testRecord("pod-a")
	if err := st.Put(rec); err != nil {
		t.Fatal(err)
	}
	got, err := st.Get("pod-a")
	if err != nil || got == nil {
		t.Fatalf("Get = %v, %v", got, err)
	}
	want := *rec
	want.Kind = KindPod
	if !equalJSON(got, &want) {
		t.Errorf("round trip changed the record beyond stamping its kind:\n got %+v\nwant %+v", got, &want)
	}
	if rec.Kind != "" {
		t.Errorf("Put changed its argument's kind to %q", rec.Kind)
	}
	fi, err := os.Stat(filepath.Join(dir, fileName("pod-a")))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode %#o, want 0600", fi.Mode().Perm())
	}
	// A rewrite replaces the file and leaves no temp file behind.
	rec.PodName = "web-1"
	if err := st.Put(rec); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("state dir holds %d entries after two writes, want 1", len(entries))
	}
	if err := st.Delete("pod-a"); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("pod-a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if r, _ := st.Get("pod-a"); r != nil {
		t.Error("record survived Delete")
	}
}

func TestStoreFileNameIsSafe(t *testing.T) {
	for _, uid := range []string{"../../etc/passwd", "quarantine", ".tmp-x", strings.Repeat("z", 128)} {
		name := fileName(uid)
		if !isRecordName(name) || strings.Contains(name, "/") || strings.HasPrefix(name, ".") {
			t.Errorf("uid %q maps to unsafe name %q", uid, name)
		}
	}
}

func TestStoreReloadAndQuarantine(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"pod-a", "pod-b"} {
		if err := st.Put(testRecord(uid)); err != nil {
			t.Fatal(err)
		}
	}
	// Damage of every kind a crash, a disk or a person can leave.
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fileName("garbage"), "{not json")
	data, _ := os.ReadFile(filepath.Join(dir, fileName("pod-a")))
	write(fileName("pod-c"), string(data)) // pod-a's record under pod-c's name
	bad := testRecord("pod-d")
	bad.Spec.Mode = "SIDEWAYS"
	if err := st.Put(bad); err != nil {
		t.Fatal(err)
	}
	future := testRecord("pod-e")
	future.Version = Version + 1
	if err := st.Put(future); err != nil {
		t.Fatal(err)
	}
	write(".tmp-"+fileName("pod-f")+"-123", "half written")
	write("README", "not a record; left alone")

	var logs strings.Builder
	st2, err := Open(dir, hclog.New(&hclog.LoggerOptions{Output: &logs}))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st2.List()
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, r := range recs {
		uids = append(uids, r.PodUID)
	}
	if strings.Join(uids, ",") != "pod-a,pod-b" && strings.Join(uids, ",") != "pod-b,pod-a" {
		t.Errorf("reloaded %v, want pod-a and pod-b", uids)
	}
	q, err := os.ReadDir(filepath.Join(dir, QuarantineDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 3 {
		t.Errorf("Quarantined %d files, want 3 (garbage, misplaced, bad mode)", len(q))
	}
	// A newer daemon's record is valid, just not ours: it stays in place
	// for that daemon, and asking for it says what to do.
	if _, err := os.Stat(filepath.Join(dir, fileName("pod-e"))); err != nil {
		t.Errorf("newer-format record was moved: %v", err)
	}
	if r, err := st2.Get("pod-e"); r != nil || err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Errorf("Get of a newer-format record = %v, %v; want an error saying to upgrade", r, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-"+fileName("pod-f")+"-123")); !os.IsNotExist(err) {
		t.Error("stale temp file survived Open")
	}
	if _, err := os.Stat(filepath.Join(dir, "README")); err != nil {
		t.Error("a foreign file was touched")
	}
	for _, want := range []string{"corrupt record", fileName("garbage")} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// Get quarantines too, and reports the pod as absent.
	write(fileName("pod-g"), "[]")
	if r, err := st2.Get("pod-g"); r != nil || err != nil {
		t.Errorf("Get of corrupt record = %v, %v; want absent", r, err)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName("pod-g"))); !os.IsNotExist(err) {
		t.Error("corrupt record not moved aside by Get")
	}
	// A record that exists but cannot be read right now (here: something
	// that is not a file under its name) is an error, not a released pod:
	// quarantining it would leave the pod's capture untracked.
	if err := os.Mkdir(filepath.Join(dir, fileName("pod-h")), 0o700); err != nil {
		t.Fatal(err)
	}
	if r, err := st2.Get("pod-h"); r != nil || err == nil {
		t.Errorf("Get of an unreadable record = %v, %v; want an error", r, err)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName("pod-h"))); err != nil {
		t.Errorf("unreadable record was moved: %v", err)
	}
}

func TestSameIntentIgnoresTimestamps(t *testing.T) {
	a, b := testRecord("p"), testRecord("p")
	b.UpdatedAt = b.UpdatedAt.Add(time.Hour)
	if !SameIntent(a, b) {
		t.Error("timestamps must not count as a change")
	}
	b.PodIPs = []string{"10.0.0.9"}
	if SameIntent(a, b) {
		t.Error("changed IPs must count as a change")
	}
	if SameIntent(nil, a) {
		t.Error("a new record is a change")
	}

}

// BenchmarkStoreGet is one read of a pod's record, as the Kubernetes
// agent makes on every event of a captured pod (lifecycle.Enrolled).
func BenchmarkStoreGet(b *testing.B) {
	st, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	r := testRecord("bench-pod")
	r.Spec = SpecOf(benchSpec())
	if err := st.Put(r); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if got, err := st.Get("bench-pod"); err != nil || got == nil {
			b.Fatal(got, err)
		}
	}
}
