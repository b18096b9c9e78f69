package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestSightingsSurviveReopenAndSkipJunk(t *testing.T) {
	dir := t.TempDir()
	s, err := openSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := sighting{PodUID: "u1", Namespace: "shop", Name: "web", NetnsPath: "/var/run/netns/cni-1", NetnsID: "4:4026532000:77", PodIPs: []string{"10.0.0.5"}}
	if err := s.put(v); err != nil {
		t.Fatal(err)
	}
	// What a crash or another program could leave in the directory.
	for name, body := range map[string]string{
		"u2.json":         "{not json",
		"u3.json":         `{"pod_uid":"other","netns_id":"4:1:1"}`,
		"u4.json":         `{"pod_uid":"u4","netns_id":"garbage"}`,
		".tmp-u1.json-99": "{}",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := openSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.uids(); len(got) != 1 || got[0] != "u1" {
		t.Fatalf("reopened sightings %v, want [u1]", got)
	}
	if g := s2.get("u1"); g == nil || g.NetnsPath != v.NetnsPath || g.NetnsID != v.NetnsID {
		t.Fatalf("reopened sighting %+v", g)
	}
	for _, name := range []string{"u2.json", "u3.json", "u4.json", ".tmp-u1.json-99"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("unusable %s kept", name)
		}
	}
	if err := s2.forget("u1"); err != nil {
		t.Fatal(err)
	}
	if err := s2.forget("u1"); err != nil {
		t.Fatalf("second forget: %v", err)
	}
	s3, err := openSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s3.uids(); len(got) != 0 {
		t.Errorf("forgotten sighting came back: %v", got)
	}
}

func TestSightingsRefuseRelativeDir(t *testing.T) {
	if _, err := openSightings("relative/dir", nil); err == nil {
		t.Error("relative directory accepted")
	}
}

// reopened is what a restarted daemon would read from dir.
func reopened(t *testing.T, dir string) *sightings {
	t.Helper()
	s, err := openSightings(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}

// A runtime's sighting is the agent's at once and the disk's soon after,
// and a clean stop (close) writes what is still pending.
func TestSightingLaterIsReadAtOnceAndWritten(t *testing.T) {
	dir := t.TempDir()
	s := reopened(t, dir)
	v := sighting{PodUID: "u1", Namespace: "shop", Name: "web", NetnsPath: "/var/run/netns/cni-1", NetnsID: "4:4026532000:77", PodIPs: []string{"10.0.0.5"}}
	s.putLater(v)
	if g := s.get("u1"); g == nil || g.NetnsID != v.NetnsID {
		t.Fatalf("get right after putLater: %+v", g)
	}
	if got := s.uids(); len(got) != 1 || got[0] != "u1" {
		t.Fatalf("uids right after putLater: %v", got)
	}
	// Written without a close: the writer empties what is pending.
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := len(s.pending)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sighting never reached the disk")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if g := reopened(t, dir).get("u1"); g == nil || g.NetnsID != v.NetnsID {
		t.Fatalf("on disk: %+v", g)
	}

	// Many at once, then a clean stop: every one is on disk.
	for i := range 50 {
		w := v
		w.PodUID, w.NetnsID = fmt.Sprintf("p%d", i), fmt.Sprintf("4:4026532%03d:77", i)
		s.putLater(w)
	}
	s.close()
	if got := reopened(t, dir).uids(); len(got) != 51 {
		t.Fatalf("after close the disk holds %d sightings, want 51", len(got))
	}
}

// A forget right after a putLater wins, whatever the writer was doing:
// the sighting neither stays in memory nor comes back from disk.
func TestSightingForgetAfterPutLaterWins(t *testing.T) {
	dir := t.TempDir()
	s := reopened(t, dir)
	for i := range 200 {
		uid := fmt.Sprintf("u%d", i)
		s.putLater(sighting{PodUID: uid, Namespace: "shop", Name: "web", NetnsPath: "/var/run/netns/cni-1", NetnsID: fmt.Sprintf("4:%d:77", 4026532000+i)})
		if i%3 == 0 {
			runtime.Gosched()
		}
		if err := s.forget(uid); err != nil {
			t.Fatal(err)
		}
		if g := s.get(uid); g != nil {
			t.Fatalf("%s: get after forget: %+v", uid, g)
		}
	}
	s.close()
	if got := s.uids(); len(got) != 0 {
		t.Errorf("forgotten sightings in memory: %v", got)
	}
	if got := reopened(t, dir).uids(); len(got) != 0 {
		t.Errorf("forgotten sightings came back from disk: %v", got)
	}
}

// A put after a putLater of the same pod is the one that stays.
func TestSightingPutAfterPutLaterWins(t *testing.T) {
	dir := t.TempDir()
	s := reopened(t, dir)
	old := sighting{PodUID: "u1", Namespace: "shop", Name: "web", NetnsPath: "/var/run/netns/cni-1", NetnsID: "4:4026532000:77"}
	s.putLater(old)
	now := old
	now.NetnsPath, now.NetnsID = "/var/run/netns/cni-2", "4:4026532001:77"
	if err := s.put(now); err != nil {
		t.Fatal(err)
	}
	s.close()
	if g := reopened(t, dir).get("u1"); g == nil || g.NetnsID != now.NetnsID {
		t.Fatalf("on disk: %+v, want the later put's namespace", g)
	}
}
