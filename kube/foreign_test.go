package kube

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestForeignCaptureIsACaptureRefusedEvent: a pod refused for another
// agent's capture (take-over off, or legacy rules) gets a CaptureRefused
// Event naming what was found: the same AddPod cannot succeed until the
// namespace changes.
func TestForeignCaptureIsACaptureRefusedEvent(t *testing.T) {
	for _, tc := range []struct {
		f    *nft.Foreign
		want string
	}{
		{capturetest.IstioForeign(false), "iptables-nft chain ip nat ISTIO_OUTPUT"},
		{&nft.Foreign{Legacy: []netns.XTable{{Family: "ip", Name: "nat", Entries: 1}}}, "legacy iptables table nat"},
	} {
		rec := record.NewFakeRecorder(1)
		a := &Agent{events: rec}
		err := capture.CheckForeign("/var/run/netns/cni-1", tc.f, false)
		a.Added(&nftredirv1.AddPodRequest{PodUid: "u1", PodName: "web", PodNamespace: "mesh"}, false, err)
		select {
		case ev := <-rec.Events:
			if !strings.HasPrefix(ev, "Warning CaptureRefused ") || !strings.Contains(ev, tc.want) {
				t.Errorf("event %q; want a CaptureRefused warning naming %q", ev, tc.want)
			}
		default:
			t.Errorf("no event for %v", err)
		}
	}
}

// TestForeignCaptureKeepsThePodsNamespace: a pod refused for another
// agent's capture keeps its remembered namespace, so that the agent's
// retries enrol it once the namespace is clean. The path is still the
// pod's; forgetting it (as for a path that no longer leads anywhere)
// left the pod uncaptured until a new sandbox or a runtime scan found it.
func TestForeignCaptureKeepsThePodsNamespace(t *testing.T) {
	_, a, e, ctx := startMeshAgent(t)
	refused := capture.CheckForeign("/run/netns/web", capturetest.IstioForeign(false), false)
	e.refuse.Store(&refused)
	req := &nftredirv1.AddPodRequest{PodUid: "uid-web", PodName: "web", PodNamespace: "mesh", NetnsPath: "/run/netns/web"}
	if _, err := e.AddPod(ctx, req); err == nil {
		t.Fatal("the refused AddPod succeeded")
	}
	// The agent's own syncs retry the pod and meet the same refusal.
	before := e.agentEnrols.Load()
	waitFor(t, "the agent to retry the refused pod", func() bool { return e.agentEnrols.Load() > before })
	time.Sleep(100 * time.Millisecond)
	if a.seen.get("uid-web") == nil {
		t.Fatal("the pod's namespace was forgotten after a refusal for foreign capture")
	}
	// The other agent's rules are gone: a later retry enrols the pod.
	e.refuse.Store(nil)
	a.queue.Add("uid-web")
	waitFor(t, "the pod enrolled once the namespace is clean", func() bool {
		rec, _ := e.Enrolled("uid-web")
		return rec.GetNetnsPath() == "/run/netns/web"
	})
}
