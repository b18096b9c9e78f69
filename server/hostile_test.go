package server

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestRemovePodAfterThePodRenamedLoopback: the pod owns its namespace; a
// renamed loopback must not make it unreleasable.
func TestRemovePodAfterThePodRenamedLoopback(t *testing.T) {
	ts := startServer(t, true, withWorld(kernelWorld(t)))
	ns := ts.newNS(t)
	ts.mustAdd(t, "pod-lo", ns)
	for _, args := range [][]string{{"link", "set", "lo", "down"}, {"link", "set", "lo", "name", "podlo"}, {"link", "set", "podlo", "up"}} {
		run(t, "ip", append([]string{"-n", filepath.Base(ns)}, args...)...)
	}
	resp, err := ts.api.RemovePod(ctxT(t), &nftredirv1.RemovePodRequest{PodUid: "pod-lo"})
	if err != nil || !resp.Existed {
		t.Fatalf("RemovePod after lo was renamed: %v, %v; want existed", resp, err)
	}
	if st := ts.look(t, ns); st.table != "" || st.rules != 0 {
		t.Errorf("the pod's table or rule is still there: %+v", st)
	}
	if recs := ts.records(t); len(recs) != 0 {
		t.Errorf("records left: %v", recs)
	}
}

// TestAddPodOnAHungMount: a netns_path on a mount that never answers gets
// Unavailable in bounded time, changes nothing, and the daemon serves on.
func TestAddPodOnAHungMount(t *testing.T) {
	ts := startServer(t, true, withWorld(kernelWorld(t)))
	hung, _ := nstest.HungMount(t)
	start := time.Now()
	_, err := ts.add(t, "pod-hung", filepath.Join(hung, "netns"))
	if status.Code(err) != codes.Unavailable || time.Since(start) > 3*netns.DefaultOpenTimeout {
		t.Fatalf("AddPod on a hung mount: %v after %s; want Unavailable after about %s", err, time.Since(start), netns.DefaultOpenTimeout)
	}
	if recs := ts.records(t); len(recs) != 0 {
		t.Errorf("records after the refused AddPod: %v", recs)
	}
	ts.mustAdd(t, "pod-ok", ts.newNS(t))
}
