package e2e

import (
	"net/netip"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestRerouteInterfaces: TCP entering the pod on a rerouted interface (a
// VM's or nested containers' traffic, behind a veth the pod holds) is the
// pod's outbound traffic: it lands on the proxy's outbound listener with
// its original destination, where without the option it is taken for
// inbound traffic; eth0 is still inbound capture; with inbound capture
// off the interface is still rerouted (Istio's ingress mode keeps it).
func TestRerouteInterfaces(t *testing.T) {
	forEachMode(t, func(t *testing.T, p *pod) {
		vm := nstest.NewNetns(t)
		p.Pod.IPBatch(t,
			"link add virt0 type veth peer name eth0 netns "+vm.Name,
			"addr add 10.97.0.1/24 dev virt0",
			"link set virt0 up",
		)
		vm.IPBatch(t,
			"addr add 10.97.0.2/24 dev eth0",
			"link set eth0 up",
			"route add default via 10.97.0.1",
		)
		orig := netip.AddrPortFrom(p.a.Peer, serverPort)
		fromVM := p.to(p.a.Peer, serverPort)

		p.enrol(t, p.spec())
		p.expect(t, vm, fromVM, nstest.ProxyInbound)

		s := p.spec()
		s.RerouteInterfaces = []string{"virt0"}
		p.enrol(t, s)
		r := p.expect(t, vm, fromVM, nstest.ProxyOutbound)
		if r.Listener == nstest.ProxyOutbound {
			if r.OrigDst != orig {
				t.Errorf("rerouted connection has SO_ORIGINAL_DST %v; want %s", r.OrigDst, orig)
			}
			if want := netip.MustParseAddr("10.97.0.2"); r.Remote.Addr() != want {
				t.Errorf("outbound listener sees the VM as %s; want %s", r.Remote.Addr(), want)
			}
		}
		wantInbound(t, p.v.mode, p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound), netip.AddrPortFrom(p.a.Pod, appPort))
		p.wantOutbound(t, p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), nstest.ProxyOutbound), nstest.ProxyOutbound, orig)

		s.NoInboundCapture = true
		p.enrol(t, s)
		p.expect(t, vm, fromVM, nstest.ProxyOutbound)
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), app)
	})
}
