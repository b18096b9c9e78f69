package state

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/netns"
)

// fixtures is what main 1a6b6e4 wrote (testdata/main-1a6b6e4/README.md).
const fixtures = "testdata/main-1a6b6e4"

// copyTree copies a fixture directory to a fresh temporary one, so that
// migrating it leaves the fixtures as they are.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// tree lists the files under dir, relative, sorted.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return err
	})
	sort.Strings(out)
	return out
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func TestReadsAndMigratesMain1a6b6e4PodRecords(t *testing.T) {
	dir := copyTree(t, filepath.Join(fixtures, "pods"))
	before := tree(t, dir)
	st, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.List()
	if err != nil {
		t.Fatal(err)
	}
	byUID := map[string]*Record{}
	for _, r := range recs {
		byUID[r.PodUID] = r
	}
	if len(recs) != 3 || byUID["pod-plain"] == nil || byUID["pod-moving"] == nil || byUID["pod-removing"] == nil {
		t.Fatalf("read %d records %v; want pod-plain, pod-moving, pod-removing", len(recs), slices.Collect(func(yield func(string) bool) {
			for uid := range byUID {
				yield(uid)
			}
		}))
	}
	plain := byUID["pod-plain"]
	if plain.Version != 1 || plain.PodNamespace != "shop" || plain.ServiceAccount == nil || *plain.ServiceAccount != "bookinfo-reviews" ||
		plain.Spec.TProxyV4 != "127.0.0.1" || !slices.Equal(plain.Spec.ExcludeOutboundCIDRs, []string{"10.96.0.0/12"}) ||
		!slices.Equal(plain.Spec.ExcludeInboundPorts, []uint16{15020}) || plain.Leaving != nil || plain.Removing {
		t.Errorf("pod-plain read as %+v", plain)
	}
	if _, err := plain.Ruleset(); err != nil {
		t.Errorf("pod-plain builds no ruleset: %v", err)
	}
	moving := byUID["pod-moving"]
	want := &Leaving{NetnsPath: "/run/netns/old-sandbox", NetnsID: "4:4026532500", Routing: RoutingOf(netns.DefaultRouting())}
	if moving.Leaving == nil || !reflect.DeepEqual(moving.Leaving, want) {
		t.Errorf("pod-moving's leaving = %+v, want %+v", moving.Leaving, want)
	}
	if !byUID["pod-removing"].Removing {
		t.Error("pod-removing lost its removing flag")
	}

	left, err := st.Leftovers()
	if err != nil || len(left) != 1 {
		t.Fatalf("Leftovers = %v, %v; want pod-torndown's", left, err)
	}
	if left[0].Record.PodUID != "pod-torndown" || !left[0].ReleasedAt.Equal(time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)) {
		t.Errorf("leftover %s released %s", left[0].Record.PodUID, left[0].ReleasedAt)
	}

	qs, err := st.QuarantinedAll()
	if err != nil || len(qs) != 1 {
		t.Fatalf("QuarantinedAll = %v, %v; want pod-damaged's alone (pod-released's is released)", qs, err)
	}
	q := qs[0]
	// Cut in its spec: what comes before is salvaged, the routing after
	// it is not.
	if q.PodUID != "pod-damaged" || q.Salvage.NetnsPath != "/run/netns/pod-damaged" || q.Salvage.NetnsID != "4:4026532591" ||
		q.Salvage.Routing != nil || !strings.Contains(q.Reason, "unexpected end of JSON") {
		t.Errorf("quarantined record salvaged as %+v (routing %v)", q, q.Salvage.Routing)
	}
	// Reading changed nothing on disk: version 1 pod records are current.
	if after := tree(t, dir); !slices.Equal(before, after) {
		t.Errorf("reading moved files:\nbefore %v\nafter  %v", before, after)
	}

	// Written back, a record differs from main's only by its kind, a
	// field main's decoder ignores.
	old := readJSON(t, st.RecordPath("pod-moving"))
	if err := st.Put(moving); err != nil {
		t.Fatal(err)
	}
	neu := readJSON(t, st.RecordPath("pod-moving"))
	if neu["kind"] != "pod" || neu["version"] != float64(1) {
		t.Errorf("rewritten record has kind %v version %v; want pod, 1", neu["kind"], neu["version"])
	}
	delete(neu, "kind")
	if !reflect.DeepEqual(old, neu) {
		t.Errorf("rewritten record differs from main's beyond its kind:\nmain %v\nnow  %v", old, neu)
	}
	if r, err := st.Get("pod-moving"); err != nil || !SameIntent(r, moving) || r.Kind != KindPod {
		t.Errorf("Get after rewrite = %+v, %v", r, err)
	}
}

func TestReadsAndMigratesMain1a6b6e4Sightings(t *testing.T) {
	dir := copyTree(t, filepath.Join(fixtures, "seen"))
	const web, batch = "0b4f7a4e-6a1e-4c39-9a53-2f1b8f3c1a01", "7c0e3d1a-9a44-4d5e-8d0b-0c2a9b7e6f02"
	seen, err := OpenSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	check := func(s *Sightings) {
		t.Helper()
		if uids := s.UIDs(); len(uids) != 2 {
			t.Fatalf("sightings of %v, want 2", uids)
		}
		w := s.Get(web)
		if w == nil || w.Namespace != "shop" || w.Name != "web-0" || w.NetnsPath != "/var/run/netns/cni-11111111-2222-3333-4444-555555555555" ||
			w.NetnsID != "4:4026532000:77" || !slices.Equal(w.PodIPs, []string{"10.244.0.12", "fd00::12"}) ||
			!bytes.Equal(w.Options, []byte{0x08, 0x01, 0x10, 0xc1, 0x7a}) || !w.SeenAt.Equal(at) {
			t.Errorf("web's sighting read as %+v", w)
		}
		if b := s.Get(batch); b == nil || b.Namespace != "default" || b.Name != "batch" || b.NetnsID != "4:4026532001:78" || len(b.PodIPs) != 0 || b.Options != nil {
			t.Errorf("batch's sighting read as %+v", b)
		}
	}
	check(seen)
	for _, uid := range []string{web, batch} {
		if _, err := os.Stat(filepath.Join(dir, uid+".json")); !os.IsNotExist(err) {
			t.Errorf("legacy sighting %s.json still there (%v)", uid, err)
		}
		m := readJSON(t, filepath.Join(dir, fileName(uid)))
		if m["kind"] != "sighting" || m["version"] != float64(1) || m["podUid"] != uid {
			t.Errorf("migrated sighting of %s: %v", uid, m)
		}
	}
	migrated := tree(t, dir)
	again, err := OpenSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(again)
	if now := tree(t, dir); !slices.Equal(now, migrated) {
		t.Errorf("a second open changed files:\nbefore %v\nafter  %v", migrated, now)
	}

	// A crash between the migrated file's write and the legacy file's
	// removal leaves both; the next open keeps one record.
	legacy, _ := os.ReadFile(filepath.Join(fixtures, "seen", web+".json"))
	if err := os.WriteFile(filepath.Join(dir, web+".json"), legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	third, err := OpenSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(third)
	if now := tree(t, dir); !slices.Equal(now, migrated) {
		t.Errorf("after an interrupted migration:\nwant %v\ngot  %v", migrated, now)
	}
}

func TestReadsAndMigratesMain1a6b6e4Marks(t *testing.T) {
	dir := copyTree(t, filepath.Join(fixtures, "seen", "annotated"))
	const web, gone = "0b4f7a4e-6a1e-4c39-9a53-2f1b8f3c1a01", "5d2c6b8a-1f3e-4a7b-9c0d-3e4f5a6b7c03"
	marks, err := OpenAnnotated(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[string][2]string{web: {"shop", "web-0"}, gone: {"shop", "gone"}} {
		m := marks.Get(uid)
		if m == nil || m.PodNamespace != want[0] || m.PodName != want[1] {
			t.Errorf("mark of %s read as %+v, want %v", uid, m, want)
		}
		if _, err := os.Stat(filepath.Join(dir, uid+".mark")); !os.IsNotExist(err) {
			t.Errorf("legacy mark %s.mark still there (%v)", uid, err)
		}
		if j := readJSON(t, filepath.Join(dir, fileName(uid))); j["kind"] != "annotated" || j["version"] != float64(1) {
			t.Errorf("migrated mark of %s: %v", uid, j)
		}
	}
	if got := tree(t, dir); len(got) != 2 {
		t.Errorf("files after migration: %v", got)
	}
}

// TestMemoKeepsWhatItCannotRead: a record of a newer version stays for
// the daemon that wrote it; a damaged mark is quarantined, a damaged
// sighting removed.
func TestMemoKeepsWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fileName("u-newer"), `{"kind":"annotated","version":2,"podUid":"u-newer"}`)
	write(fileName("u-bad"), `{"kind":"annotated","version":1,"podUid":`)
	write(fileName("u-other"), `{"kind":"sighting","version":1,"podUid":"u-other","netnsId":"4:1:1"}`)
	write("u-legacy.mark", "ns/name\n")
	m, err := OpenAnnotated(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if uids := m.UIDs(); !slices.Equal(uids, []string{"u-legacy"}) {
		t.Errorf("marks %v, want [u-legacy]", uids)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName("u-newer"))); err != nil {
		t.Errorf("newer mark moved: %v", err)
	}
	q := tree(t, filepath.Join(dir, QuarantineDir))
	for _, uid := range []string{"u-bad", "u-other"} {
		if !slices.ContainsFunc(q, func(name string) bool { return strings.HasPrefix(name, fileName(uid)+".") }) {
			t.Errorf("quarantine %v lacks %s's record", q, uid)
		}
	}
	if len(q) != 2 {
		t.Errorf("quarantined %v, want the damaged mark and the sighting in its place", q)
	}
	if err := m.Put(Annotated{PodUID: "../escape"}); err == nil {
		t.Error("a mark of an invalid uid was written")
	}
}
