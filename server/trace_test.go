package server

import (
	"strings"
	"testing"
	"time"
)

// TestAddPodLogShowsItsPhases: an AddPod's request log line carries the
// time of each of its phases (internal/calltrace), which make bench reads
// to show where the call's time goes.
func TestAddPodLogShowsItsPhases(t *testing.T) {
	ts := startServer(t, true)
	ts.mustAdd(t, "pod-1", ts.newNS(t))
	var line string
	for deadline := time.Now().Add(5 * time.Second); line == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for l := range strings.SplitSeq(ts.logs.String(), "\n") {
			if strings.Contains(l, "grpc.method=AddPod") {
				line = l
			}
		}
	}
	if line == "" {
		t.Fatalf("no AddPod request line in the log:\n%s", ts.logs.String())
	}
	for _, phase := range []string{"lock", "open", "record", "kernel", "probe", "zds"} {
		if !strings.Contains(line, "phase."+phase+"_ms=") {
			t.Errorf("the AddPod line lacks phase %q: %s", phase, line)
		}
	}
}
