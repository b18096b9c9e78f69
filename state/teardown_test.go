package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLeaveForTeardown(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if moved, err := s.LeaveForTeardown("never-enrolled", time.Now()); moved || err != nil {
		t.Errorf("leaving a pod with no record: moved %v, %v", moved, err)
	}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i, uid := range []string{"b", "a", "b"} {
		if err := s.Put(testRecord(uid)); err != nil {
			t.Fatal(err)
		}
		if moved, err := s.LeaveForTeardown(uid, t0.Add(time.Duration(-i)*time.Minute)); !moved || err != nil {
			t.Fatal(moved, err)
		}
		if r, err := s.Get(uid); err != nil || r != nil {
			t.Fatalf("record of %s after leaving it: %v, %v", uid, r, err)
		}
	}
	if n, err := s.Count(); err != nil || n != 0 {
		t.Errorf("Count = %d, %v; records left for teardown are not enrolled pods", n, err)
	}
	all, err := s.Leftovers()
	if err != nil || len(all) != 3 {
		t.Fatalf("Leftovers = %v, %v", all, err)
	}
	for i, want := range []string{"b", "a", "b"} {
		l := all[i]
		if l.Record.PodUID != want || !l.ReleasedAt.Equal(t0.Add(time.Duration(i-2)*time.Minute)) {
			t.Errorf("leftover %d: pod %s released %s; want pod %s, oldest first", i, l.Record.PodUID, l.ReleasedAt, want)
		}
	}
	of, err := s.LeftoversOf("b")
	if err != nil || len(of) != 2 || of[0].Record.PodUID != "b" || of[1].Record.PodUID != "b" {
		t.Fatalf("LeftoversOf(b) = %v, %v", of, err)
	}
	if err := s.DropLeftover(of[0].Path); err != nil {
		t.Fatal(err)
	}
	if err := s.DropLeftover(of[0].Path); err != nil {
		t.Errorf("dropping a leftover twice: %v", err)
	}
	if of, _ := s.LeftoversOf("b"); len(of) != 1 {
		t.Errorf("after one drop, %d leftovers of b", len(of))
	}
	if err := s.DropLeftover(s.RecordPath("a")); err == nil || !strings.Contains(err.Error(), "not a record left for teardown") {
		t.Errorf("DropLeftover of a pod's record = %v; want it refused", err)
	}
}

// A leftover of a newer format is kept for that daemon and not listed.
func TestLeftoverOfANewerFormatIsSkipped(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := testRecord("p")
	r.Version = Version + 1
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir(), TeardownDir), 0o700); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(s.Dir(), TeardownDir, fileName("p")+"."+time.Now().UTC().Format(stampLayout))
	if err := os.Rename(s.RecordPath("p"), dst); err != nil {
		t.Fatal(err)
	}
	if all, err := s.Leftovers(); err != nil || len(all) != 0 {
		t.Errorf("Leftovers = %v, %v; want the newer one skipped", all, err)
	}
	if _, err := os.Stat(dst); err != nil {
		t.Errorf("the newer leftover was moved: %v", err)
	}
}
