package kube

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftredir/nftredir/state"
)

// TestAgentReadsItsRecordsAfterTheMove is the daemon's start after an
// upgrade from main fbaf3e9, whose agent kept its records in a directory
// of its own: moved under the state directory (state.AdoptAgentDir), they
// are the agent's sightings and marks, as main wrote them.
func TestAgentReadsItsRecordsAfterTheMove(t *testing.T) {
	run := t.TempDir()
	old, stateDir := filepath.Join(run, "seen"), filepath.Join(run, "pods")
	if err := os.CopyFS(old, os.DirFS("../state/testdata/main-fbaf3e9/seen")); err != nil {
		t.Fatal(err)
	}
	if n, err := state.AdoptAgentDir(old, stateDir, nil); err != nil || n != 4 {
		t.Fatalf("adopt: %d files, %v", n, err)
	}
	a, err := New(Config{Client: fake.NewClientset(), NodeName: "node-1", Dir: state.AgentDir(stateDir), Sweep: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s := a.seen.get("0b4f7a4e-6a1e-4c39-9a53-2f1b8f3c1a01")
	if s == nil || s.NetnsPath != "/var/run/netns/cni-11111111-2222-3333-4444-555555555555" || s.NetnsID != "4:4026532000:77" || len(s.Options) != 5 {
		t.Errorf("sighting of web-0: %+v", s)
	}
	if len(a.seen.uids()) != 2 {
		t.Errorf("sightings: %v", a.seen.uids())
	}
	for uid, want := range map[string]podRef{
		"0b4f7a4e-6a1e-4c39-9a53-2f1b8f3c1a01": {"shop", "web-0"},
		"5d2c6b8a-1f3e-4a7b-9c0d-3e4f5a6b7c03": {"shop", "gone"},
	} {
		if got, ok := a.marks.get(uid); !ok || got != want {
			t.Errorf("mark of %s: %v %v, want %v", uid, got, ok, want)
		}
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Errorf("old directory left: %v", err)
	}
}
