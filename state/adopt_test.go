package state

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentFixtures is the Kubernetes agent's own directory as main fbaf3e9
// wrote it (testdata/main-fbaf3e9/README.md).
const agentFixtures = "testdata/main-fbaf3e9"

// TestAdoptsAgentDirOfMainFbaf3e9 is an upgrade from main fbaf3e9: its
// Kubernetes directory next to its state directory. Every file moves in,
// the old directory goes, the pod records are untouched, and what the
// agent opens in the new place is what main wrote.
func TestAdoptsAgentDirOfMainFbaf3e9(t *testing.T) {
	run := t.TempDir()
	old := filepath.Join(run, "seen")
	if err := os.Rename(copyTree(t, filepath.Join(agentFixtures, "seen")), old); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(run, "pods")
	if err := os.Rename(copyTree(t, filepath.Join(fixtures, "pods")), stateDir); err != nil {
		t.Fatal(err)
	}
	wantOld := tree(t, old)
	podsBefore := tree(t, stateDir)

	n, err := AdoptAgentDir(old, stateDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(wantOld) || n != 4 {
		t.Fatalf("moved %d files, want the %d of %v", n, len(wantOld), wantOld)
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Fatalf("old directory still there: %v", err)
	}
	if got := tree(t, AgentDir(stateDir)); !slices.Equal(got, wantOld) {
		t.Fatalf("agent directory holds %v, want %v", got, wantOld)
	}
	var podsAfter []string
	for _, f := range tree(t, stateDir) {
		if !strings.HasPrefix(f, agentSubdir+"/") {
			podsAfter = append(podsAfter, f)
		}
	}
	if !slices.Equal(podsAfter, podsBefore) {
		t.Fatalf("pod records changed: %v, were %v", podsAfter, podsBefore)
	}
	for _, f := range wantOld {
		want, _ := os.ReadFile(filepath.Join(agentFixtures, "seen", f))
		got, _ := os.ReadFile(filepath.Join(AgentDir(stateDir), f))
		if string(got) != string(want) {
			t.Errorf("%s changed in the move:\n%s\nwant\n%s", f, got, want)
		}
	}

	seen, err := OpenSightings(AgentDir(stateDir), nil)
	if err != nil {
		t.Fatal(err)
	}
	web := seen.Get("0b4f7a4e-6a1e-4c39-9a53-2f1b8f3c1a01")
	want := &Sighting{Kind: KindSighting, Version: 1, PodUID: "0b4f7a4e-6a1e-4c39-9a53-2f1b8f3c1a01", Namespace: "shop", Name: "web-0",
		NetnsPath: "/var/run/netns/cni-11111111-2222-3333-4444-555555555555", NetnsID: "4:4026532000:77",
		PodIPs: []string{"10.244.0.12", "fd00::12"}, Options: []byte{0x08, 0x01, 0x10, 0xc1, 0x7a}, SeenAt: time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)}
	if !reflect.DeepEqual(web, want) {
		t.Errorf("sighting read back as %+v, want %+v", web, want)
	}
	if uids := seen.UIDs(); len(uids) != 2 {
		t.Errorf("sightings: %v, want 2", uids)
	}
	marks, err := OpenAnnotated(filepath.Join(AgentDir(stateDir), "annotated"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := marks.Get("5d2c6b8a-1f3e-4a7b-9c0d-3e4f5a6b7c03"); m == nil || m.PodNamespace != "shop" || m.PodName != "gone" {
		t.Errorf("mark read back as %+v", m)
	}
	if uids := marks.UIDs(); len(uids) != 2 {
		t.Errorf("marks: %v, want 2", uids)
	}
	store, err := Open(stateDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := store.List(); err != nil || len(recs) != 3 {
		t.Errorf("pod records beside the agent's: %d, %v; want 3", len(recs), err)
	}

	// A second start finds nothing to move.
	if n, err := AdoptAgentDir(old, stateDir, nil); n != 0 || err != nil {
		t.Fatalf("second adopt: %d, %v", n, err)
	}
}

// TestAdoptsAgentDirOfMain1a6b6e4 is an upgrade from the format before the
// kinds: the files move as they are, and the agent's open migrates them
// in their new place.
func TestAdoptsAgentDirOfMain1a6b6e4(t *testing.T) {
	run := t.TempDir()
	old := filepath.Join(run, "seen")
	if err := os.Rename(copyTree(t, filepath.Join(fixtures, "seen")), old); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(run, "pods")
	if n, err := AdoptAgentDir(old, stateDir, nil); err != nil || n != 4 {
		t.Fatalf("adopt: %d, %v", n, err)
	}
	seen, err := OpenSightings(AgentDir(stateDir), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := seen.Get("7c0e3d1a-9a44-4d5e-8d0b-0c2a9b7e6f02"); s == nil || s.Version != 1 || s.Name != "batch" {
		t.Errorf("sighting read back as %+v", s)
	}
	marks, err := OpenAnnotated(filepath.Join(AgentDir(stateDir), "annotated"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(marks.UIDs()) != 2 {
		t.Errorf("marks: %v", marks.UIDs())
	}
}

// TestAdoptAfterCrash: a crash of a copy across filesystems leaves a file
// in both places; the new place's is kept, the old one dropped. A temp
// file of an interrupted write is dropped too.
func TestAdoptAfterCrash(t *testing.T) {
	run := t.TempDir()
	old, stateDir := filepath.Join(run, "seen"), filepath.Join(run, "pods")
	name := fileName("u1")
	for _, d := range []string{old, AgentDir(stateDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(old, name), []byte("old"), 0o600)
	os.WriteFile(filepath.Join(old, ".tmp-123"), []byte("half"), 0o600)
	os.WriteFile(filepath.Join(AgentDir(stateDir), name), []byte("new"), 0o600)
	if n, err := AdoptAgentDir(old, stateDir, nil); err != nil || n != 0 {
		t.Fatalf("adopt: %d, %v", n, err)
	}
	if got, _ := os.ReadFile(filepath.Join(AgentDir(stateDir), name)); string(got) != "new" {
		t.Errorf("kept %q, want the new place's", got)
	}
	if got := tree(t, AgentDir(stateDir)); !slices.Equal(got, []string{name}) {
		t.Errorf("agent directory holds %v", got)
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Errorf("old directory still there: %v", err)
	}
}

// TestAdoptRefusesOverlap: an old directory that holds the state
// directory, or lies in it, is refused before anything moves.
func TestAdoptRefusesOverlap(t *testing.T) {
	run := t.TempDir()
	stateDir := filepath.Join(run, "pods")
	os.MkdirAll(filepath.Join(stateDir, "teardown"), 0o700)
	for _, old := range []string{run, stateDir, filepath.Join(stateDir, "teardown")} {
		if _, err := AdoptAgentDir(old, stateDir, nil); err == nil {
			t.Errorf("adopt %s into %s: no error", old, stateDir)
		}
	}
	if _, err := os.Stat(filepath.Join(stateDir, "teardown")); err != nil {
		t.Fatal(err)
	}
	// The agent's place itself is no move at all.
	if n, err := AdoptAgentDir(AgentDir(stateDir), stateDir, nil); n != 0 || err != nil {
		t.Errorf("adopt of the agent's own place: %d, %v", n, err)
	}
}

// TestAdoptThroughALink: an old directory named through a symlink is the
// directory it leads to; both go once its files moved.
func TestAdoptThroughALink(t *testing.T) {
	run := t.TempDir()
	real, link, stateDir := filepath.Join(run, "kube-records"), filepath.Join(run, "seen"), filepath.Join(run, "pods")
	if err := os.Rename(copyTree(t, filepath.Join(agentFixtures, "seen")), real); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if n, err := AdoptAgentDir(link, stateDir, nil); err != nil || n != 4 {
		t.Fatalf("adopt: %d, %v", n, err)
	}
	for _, p := range []string{real, link} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", p, err)
		}
	}
	if got := tree(t, AgentDir(stateDir)); len(got) != 4 {
		t.Errorf("agent directory holds %v", got)
	}
}

// TestAdoptAcrossFilesystems: an old directory on another filesystem
// than the state directory (a rename fails with EXDEV) is copied durably,
// then removed. It needs /dev/shm on a filesystem of its own.
func TestAdoptAcrossFilesystems(t *testing.T) {
	var a, b syscall.Statfs_t
	tmp := t.TempDir()
	if syscall.Statfs(tmp, &a) != nil || syscall.Statfs("/dev/shm", &b) != nil || a.Fsid == b.Fsid {
		t.Skip("needs /dev/shm on another filesystem than the test's temp directory")
	}
	shm, err := os.MkdirTemp("/dev/shm", "nftredir-adopt-")
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	old := filepath.Join(shm, "seen")
	if err := os.Rename(copyTree(t, filepath.Join(agentFixtures, "seen")), old); err == nil {
		t.Fatal("a rename across filesystems succeeded: the setup does not test a copy")
	}
	copyInto(t, filepath.Join(agentFixtures, "seen"), old)
	stateDir := filepath.Join(tmp, "pods")
	if n, err := AdoptAgentDir(old, stateDir, nil); err != nil || n != 4 {
		t.Fatalf("adopt: %d, %v", n, err)
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Errorf("old directory still there: %v", err)
	}
	for _, f := range tree(t, filepath.Join(agentFixtures, "seen")) {
		want, _ := os.ReadFile(filepath.Join(agentFixtures, "seen", f))
		got, err := os.ReadFile(filepath.Join(AgentDir(stateDir), f))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: %v, copied as\n%s\nwant\n%s", f, err, got, want)
		}
	}
}

// copyInto copies the tree src to dst.
func copyInto(t *testing.T, src, dst string) {
	t.Helper()
	for _, f := range tree(t, src) {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdoptOfTheAgentDirUnderAnotherName: an old directory that is the
// agent's place in the state directory under another name (a link kept
// for a rollback, a parent reached through a link as /var/run is /run, or
// the same directory bind-mounted elsewhere) is nothing to move, and
// nothing in it is deleted, on every start.
func TestAdoptOfTheAgentDirUnderAnotherName(t *testing.T) {
	setup := func(t *testing.T) (stateDir string, want []string) {
		run := t.TempDir()
		stateDir = filepath.Join(run, "pods")
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		copyInto(t, filepath.Join(agentFixtures, "seen"), AgentDir(stateDir))
		return stateDir, tree(t, AgentDir(stateDir))
	}
	check := func(t *testing.T, old, stateDir string, want []string) {
		t.Helper()
		for start := 1; start <= 2; start++ {
			if n, err := AdoptAgentDir(old, stateDir, nil); n != 0 || err != nil {
				t.Errorf("start %d: adopt %s into %s: %d, %v; want nothing moved", start, old, stateDir, n, err)
			}
			if got := tree(t, AgentDir(stateDir)); !slices.Equal(got, want) {
				t.Fatalf("start %d: the agent's records are now %v; want %v", start, got, want)
			}
		}
	}
	t.Run("a link to it", func(t *testing.T) {
		stateDir, want := setup(t)
		link := filepath.Join(filepath.Dir(stateDir), "kube-seen")
		if err := os.Symlink(AgentDir(stateDir), link); err != nil {
			t.Fatal(err)
		}
		check(t, link, stateDir, want)
		if _, err := os.Lstat(link); err != nil {
			t.Errorf("the link is gone: %v", err)
		}
	})
	t.Run("its parent through a link", func(t *testing.T) {
		stateDir, want := setup(t)
		alias := filepath.Join(t.TempDir(), "run")
		if err := os.Symlink(filepath.Dir(stateDir), alias); err != nil {
			t.Fatal(err)
		}
		check(t, AgentDir(filepath.Join(alias, filepath.Base(stateDir))), stateDir, want)
		check(t, AgentDir(stateDir), filepath.Join(alias, filepath.Base(stateDir)), want)
	})
	t.Run("a bind mount of it", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("a bind mount needs root")
		}
		stateDir, want := setup(t)
		mnt := filepath.Join(t.TempDir(), "mnt")
		if err := os.Mkdir(mnt, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(AgentDir(stateDir), mnt, "", syscall.MS_BIND, ""); err != nil {
			t.Skipf("bind mount: %v", err)
		}
		t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
		check(t, mnt, stateDir, want)
	})
}
