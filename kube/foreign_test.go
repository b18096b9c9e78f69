package kube

import (
	"strings"
	"testing"

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
