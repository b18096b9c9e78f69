package e2e

import (
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/nft"
)

// TestSrcValidMark shows, with real TCP, what net.ipv4.conf.all.src_valid_mark=1
// in a pod's namespace does to capture (GKE's intranode visibility sets
// it on the node, and new namespaces copy the node's value; istio#52576,
// istio#52622). Source validation then looks the client's address up
// with the packet's mark: the tproxy mark leads to table 100's local
// route, the source counts as martian and the SYN is dropped, so inbound
// TPROXY capture fails closed (nothing reaches the app uncaptured either).
// REDIRECT marks nothing and keeps working, which is why it is the mode
// to run on such nodes.
func TestSrcValidMark(t *testing.T) {
	nstest.RequirePrivileged(t)
	for _, mode := range []nft.Mode{nft.ModeTProxy, nft.ModeRedirect} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPod(t, variant{mode: mode})
			p.enrol(t, p.spec())
			in := p.to(p.a.Pod, appPort)
			in.Timeout = time.Second
			p.expect(t, p.Peer, in, nstest.ProxyInbound)
			p.Pod.Sysctl(t, "ipv4.conf.all.src_valid_mark", "1")
			if mode == nft.ModeTProxy {
				p.expectFail(t, p.Peer, in)
			} else {
				p.expect(t, p.Peer, in, nstest.ProxyInbound)
			}
			// Outbound capture does not depend on the mark.
			p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), nstest.ProxyOutbound)
			p.Pod.Sysctl(t, "ipv4.conf.all.src_valid_mark", "0")
			p.expect(t, p.Peer, in, nstest.ProxyInbound)
		})
	}
}
