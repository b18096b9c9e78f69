package server

import (
	"strings"
	"testing"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestRemovePodAfterThePodRenamedLoopback: the pod owns its namespace; a
// renamed loopback must not make it unreleasable.
func TestRemovePodAfterThePodRenamedLoopback(t *testing.T) {
	ns := newNetns(t)
	ts := startServer(t, true)
	ts.mustAdd(t, "pod-lo", ns.path)
	for _, args := range [][]string{{"link", "set", "lo", "down"}, {"link", "set", "lo", "name", "podlo"}, {"link", "set", "podlo", "up"}} {
		run(t, "ip", append([]string{"-n", ns.name}, args...)...)
	}
	resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-lo"})
	if err != nil || !resp.Existed {
		t.Fatalf("RemovePod after lo was renamed: %v, %v; want existed", resp, err)
	}
	if ns.hasTable(t) {
		t.Error("the pod's table is still there")
	}
	if rules := run(t, "ip", "-n", ns.name, "rule", "show"); strings.Contains(rules, "0x111/0xfff") {
		t.Errorf("our rule is still there:\n%s", rules)
	}
	if recs := ts.records(t); len(recs) != 0 {
		t.Errorf("records left: %v", recs)
	}
}
