package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables/expr"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Ports of the listeners outside the proxy.
const (
	appPort         = 8080 // the pod's application
	appExcludedPort = 8081 // the same application, on a port excluded from inbound capture
	serverPort      = 9090 // a server in the peer
	serverExcluded  = 9091 // the same server, on a port excluded from outbound capture
	closedPort      = 7777 // nobody listens here, in either namespace
	dnsPort         = 53
)

// Names the non-proxy listeners answer with.
const (
	app      = "app"      // in the pod
	server   = "server"   // in the peer
	resolver = "resolver" // in the peer, UDP and TCP 53
)

const (
	proxyMark = defaults.ProxyMark
	nftTable  = nft.TableName
)

// variant is one cell of the matrix every data-path test runs over.
type variant struct {
	v6   bool
	mode nft.Mode
}

var variants = []variant{
	{false, nft.ModeTProxy},
	{false, nft.ModeRedirect},
	{true, nft.ModeTProxy},
	{true, nft.ModeRedirect},
}

func (v variant) String() string {
	if v.v6 {
		return "IPv6/" + v.mode.String()
	}
	return "IPv4/" + v.mode.String()
}

func (v variant) tcp() string {
	if v.v6 {
		return "tcp6"
	}
	return "tcp4"
}

func (v variant) udp() string {
	if v.v6 {
		return "udp6"
	}
	return "udp4"
}

// forEach runs f once per variant, in parallel: each run has its own
// namespaces, so nothing is shared.
func forEach(t *testing.T, f func(t *testing.T, p *pod)) {
	nstest.RequirePrivileged(t)
	for _, v := range variants {
		t.Run(v.String(), func(t *testing.T) {
			if v.v6 && !nstest.HaveIPv6() {
				t.Skip("kernel without IPv6")
			}
			t.Parallel()
			f(t, newPod(t, v))
		})
	}
}

// forEachMode is forEach over the capture modes only, for checks that do
// not depend on the address family.
func forEachMode(t *testing.T, f func(t *testing.T, p *pod)) {
	nstest.RequirePrivileged(t)
	for _, m := range []nft.Mode{nft.ModeTProxy, nft.ModeRedirect} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			f(t, newPod(t, variant{mode: m}))
		})
	}
}

// pod is one enrolled-or-not pod: the namespaces, the stand-in proxy and
// application inside the pod, a server and a resolver in the peer.
type pod struct {
	*nstest.Pair
	v   variant
	a   nstest.Addrs
	rec *nstest.Recorder
	h   *netns.Handle
	nl  *nft.Netlink
	id  string
}

func newPod(t *testing.T, v variant) *pod {
	t.Helper()
	p := newPodWithoutProxy(t, v)
	nstest.StartProxy(t, p.Pod, p.rec, nstest.DefaultProxyPorts)
	return p
}

// newPodWithoutProxy is a pod whose node proxy is not (yet) listening.
func newPodWithoutProxy(t *testing.T, v variant) *pod {
	t.Helper()
	p := &pod{
		Pair: nstest.NewPair(t),
		v:    v,
		a:    nstest.Family(v.v6),
		rec:  nstest.NewRecorder(),
		nl:   nft.NewNetlink(),
		id:   "pod-" + strings.NewReplacer("/", "-").Replace(t.Name()),
	}
	nstest.StartTCP(t, p.Pod, p.rec, app, appPort, appExcludedPort)
	nstest.StartTCP(t, p.Peer, p.rec, server, serverPort, serverExcluded)
	nstest.StartTCP(t, p.Peer, p.rec, resolver, dnsPort)
	resolvers := []netip.AddrPort{netip.AddrPortFrom(nstest.V4.Peer, dnsPort)}
	if nstest.HaveIPv6() {
		resolvers = append(resolvers, netip.AddrPortFrom(nstest.V6.Peer, dnsPort))
	}
	nstest.StartUDP(t, p.Peer, p.rec, resolver, resolvers...)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	p.h, err = g.Open(p.Pod.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.h.Close() })
	return p
}

// spec is the default spec in the variant's mode. Its pod id is the test
// name, so a table seen in a listing says which test made it.
func (p *pod) spec() nft.Spec {
	s := nft.DefaultSpec(p.id)
	s.Mode = p.v.mode
	return s
}

func build(t *testing.T, s nft.Spec) *nft.Ruleset {
	t.Helper()
	rs, err := nft.Build(s)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return rs
}

// enrol programs the pod the way the daemon does: routing, then the table.
func (p *pod) enrol(t *testing.T, s nft.Spec) *nft.Ruleset {
	t.Helper()
	rs := build(t, s)
	if _, err := netns.EnsureRouting(p.h, netns.DefaultRouting()); err != nil {
		t.Fatalf("EnsureRouting: %v", err)
	}
	if err := p.nl.Apply(t.Context(), p.h, rs); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return rs
}

// release undoes enrol in the daemon's order: the table, then routing.
func (p *pod) release(t *testing.T) {
	t.Helper()
	if err := p.nl.Remove(t.Context(), p.h); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := netns.RemoveRouting(p.h, netns.DefaultRouting()); err != nil {
		t.Fatalf("RemoveRouting: %v", err)
	}
}

func (p *pod) verify(t *testing.T, rs *nft.Ruleset) (nft.Status, string) {
	t.Helper()
	st, text, err := p.nl.Verify(t.Context(), p.h, rs)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return st, text
}

// to is a TCP dial of the variant's family. Dials that must fail give up
// after nstest.DefaultTimeout.
func (p *pod) to(addr netip.Addr, port uint16) nstest.Dial {
	return nstest.Dial{Network: p.v.tcp(), To: netip.AddrPortFrom(addr, port)}
}

// proxyDial is a dial made the way the proxy makes its own connections.
func (p *pod) proxyDial(addr netip.Addr, port uint16) nstest.Dial {
	d := p.to(addr, port)
	d.Mark = proxyMark
	d.Transparent = true
	return d
}

// expect makes the exchange and requires the listener want to answer it.
func (p *pod) expect(t *testing.T, from *nstest.Netns, d nstest.Dial, want string) nstest.Record {
	t.Helper()
	r, err := from.Exchange(p.rec, d)
	if err != nil {
		t.Errorf("%s -> %s %s: %v; want it answered by %s", from.Name, d.Network, d.To, err, want)
		return r
	}
	t.Logf("%s -> %s: %s", from.Name, d.To, r)
	if r.Listener != want {
		t.Errorf("%s -> %s %s answered by %s; want %s", from.Name, d.Network, d.To, r, want)
	}
	return r
}

// expectFail requires the exchange to find nobody.
func (p *pod) expectFail(t *testing.T, from *nstest.Netns, d nstest.Dial) {
	t.Helper()
	if r, err := from.Exchange(p.rec, d); err == nil {
		t.Errorf("%s -> %s %s answered by %s; want no connection", from.Name, d.Network, d.To, r)
	}
}

// wantInbound checks a record of an inbound capture: the proxy's inbound
// listener got it and the original destination can be recovered the way
// the mode promises.
func wantInbound(t *testing.T, mode nft.Mode, r nstest.Record, orig netip.AddrPort) {
	t.Helper()
	if r.Listener != nstest.ProxyInbound {
		return // expect reported it
	}
	switch mode {
	case nft.ModeTProxy:
		if r.Local != orig {
			t.Errorf("TPROXY: accepted with local address %s; want the original destination %s", r.Local, orig)
		}
	case nft.ModeRedirect:
		if r.OrigDst != orig {
			t.Errorf("REDIRECT: SO_ORIGINAL_DST is %v; want %s", r.OrigDst, orig)
		}
		if r.Local.Port() != nstest.DefaultProxyPorts.Inbound {
			t.Errorf("REDIRECT: accepted on port %d; want %d", r.Local.Port(), nstest.DefaultProxyPorts.Inbound)
		}
	}
}

func (p *pod) wantOutbound(t *testing.T, r nstest.Record, listener string, orig netip.AddrPort) {
	t.Helper()
	if r.Listener != listener {
		return
	}
	if r.OrigDst != orig {
		t.Errorf("%s has SO_ORIGINAL_DST %v; want the original destination %s", listener, r.OrigDst, orig)
	}
	if r.Remote.Addr() != p.a.Pod {
		t.Errorf("%s sees the pod as %s; want %s", listener, r.Remote.Addr(), p.a.Pod)
	}
}

func TestInboundCapture(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		// Before enrolment the application answers itself.
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), app)
		p.enrol(t, p.spec())

		for _, port := range []uint16{appPort, closedPort} {
			r := p.expect(t, p.Peer, p.to(p.a.Pod, port), nstest.ProxyInbound)
			wantInbound(t, p.v.mode, r, netip.AddrPortFrom(p.a.Pod, port))
			if r.Listener == nstest.ProxyInbound && r.Remote.Addr() != p.a.Peer {
				t.Errorf("inbound capture hides the client: remote %s, want %s", r.Remote, p.a.Peer)
			}
		}

		r := p.expect(t, p.Peer, p.to(p.a.Pod, defaults.HBONEPort), nstest.ProxyHBONE)
		if r.Listener == nstest.ProxyHBONE && r.Local != netip.AddrPortFrom(p.a.Pod, defaults.HBONEPort) {
			t.Errorf("HBONE accepted with local address %s; want %s", r.Local, netip.AddrPortFrom(p.a.Pod, defaults.HBONEPort))
		}

		// A destination the pod does not own, routed to it by the peer:
		// only the tproxy mark and table 100 (or NAT) can deliver it.
		r = p.expect(t, p.Peer, p.to(p.a.Routed, appPort), nstest.ProxyInbound)
		wantInbound(t, p.v.mode, r, netip.AddrPortFrom(p.a.Routed, appPort))

		if p.v.mode == nft.ModeTProxy {
			// Negative control: without the fwmark rule and local route a
			// tproxied packet for an address the pod does not own is routed
			// away, while the pod's own address still works.
			if err := netns.RemoveRouting(p.h, netns.DefaultRouting()); err != nil {
				t.Fatal(err)
			}
			p.expectFail(t, p.Peer, p.to(p.a.Routed, appPort))
			p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
		}
	})
}

// TestIPv6CaptureOff: with IPv6 capture off, IPv6 passes untouched in both
// directions while IPv4 is still captured.
func TestIPv6CaptureOff(t *testing.T) {
	forEachMode(t, func(t *testing.T, p *pod) {
		if !nstest.HaveIPv6() {
			t.Skip("kernel without IPv6")
		}
		s := p.spec()
		s.IPv6 = false
		p.enrol(t, s)
		p.expect(t, p.Peer, nstest.Dial{Network: "tcp6", To: netip.AddrPortFrom(nstest.V6.Pod, appPort)}, app)
		p.expect(t, p.Pod, nstest.Dial{Network: "tcp6", To: netip.AddrPortFrom(nstest.V6.Peer, serverPort)}, server)
		p.expect(t, p.Peer, p.to(nstest.V4.Pod, appPort), nstest.ProxyInbound)
		p.expect(t, p.Pod, p.to(nstest.V4.Peer, serverPort), nstest.ProxyOutbound)
	})
}

// TestInboundToProxyPorts: the proxy's other listeners are for the pod's
// own traffic. From outside, a connection to one of those ports is just
// another inbound connection and must land on the inbound listener;
// reaching the outbound listener directly would let any peer send traffic
// out through the proxy as if it came from the pod.
func TestInboundToProxyPorts(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		s := p.spec()
		s.CaptureDNS = true
		p.enrol(t, s)
		for _, port := range []uint16{defaults.OutboundPort, defaults.DNSPort} {
			r := p.expect(t, p.Peer, p.to(p.a.Pod, port), nstest.ProxyInbound)
			wantInbound(t, p.v.mode, r, netip.AddrPortFrom(p.a.Pod, port))
		}
	})
}

func TestOutboundCapture(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), server)
		p.enrol(t, p.spec())
		for _, dst := range []netip.AddrPort{
			netip.AddrPortFrom(p.a.Peer, serverPort),
			netip.AddrPortFrom(p.a.Extra, serverPort),
			// Captured even where nothing would answer.
			netip.AddrPortFrom(p.a.Peer, closedPort),
		} {
			r := p.expect(t, p.Pod, p.to(dst.Addr(), dst.Port()), nstest.ProxyOutbound)
			p.wantOutbound(t, r, nstest.ProxyOutbound, dst)
		}
	})
}

func TestProxyMarkBypass(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		p.enrol(t, p.spec())
		// Out: the proxy's upstream connection reaches the server itself.
		r := p.expect(t, p.Pod, p.proxyDial(p.a.Peer, serverPort), server)
		if r.Listener == server && r.Remote.Addr() != p.a.Pod {
			t.Errorf("server sees the proxy as %s; want %s", r.Remote.Addr(), p.a.Pod)
		}
		// In: the proxy's connections into the application, to the pod's
		// address and to loopback.
		for _, dst := range []netip.Addr{p.a.Pod, p.a.Loopback} {
			r := p.expect(t, p.Pod, p.proxyDial(dst, appPort), app)
			if r.Listener == app && r.Local != netip.AddrPortFrom(dst, appPort) {
				t.Errorf("app accepted the proxy's connection on %s; want %s", r.Local, netip.AddrPortFrom(dst, appPort))
			}
		}
	})
}

// TestSpoofedSource: the proxy connects to the application with the
// client's address as source. The application's replies go to an address
// that is not in the pod; only the connection mark and table 100 bring
// them back to the proxy.
func TestSpoofedSource(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		p.enrol(t, p.spec())
		far := netip.MustParseAddr("10.96.0.9")
		if p.v.v6 {
			far = netip.MustParseAddr("fd00:96::9")
		}
		spoofed := func(src netip.Addr) nstest.Dial {
			d := p.proxyDial(p.a.Pod, appPort)
			d.From = netip.AddrPortFrom(src, 0)
			return d
		}
		// The peer's own address (a client that is really there) and one
		// that exists nowhere (a client beyond the node).
		for _, src := range []netip.Addr{p.a.Peer, far} {
			r := p.expect(t, p.Pod, spoofed(src), app)
			if r.Listener == app && (r.Remote.Addr() != src || r.Local != netip.AddrPortFrom(p.a.Pod, appPort)) {
				t.Errorf("app saw %s -> %s; want %s -> %s", r.Remote, r.Local, src, netip.AddrPortFrom(p.a.Pod, appPort))
			}
		}

		// Negative control: without our routing the replies leave the pod
		// and the handshake never completes.
		if err := netns.RemoveRouting(p.h, netns.DefaultRouting()); err != nil {
			t.Fatal(err)
		}
		p.expectFail(t, p.Pod, spoofed(p.a.Peer))
		if _, err := netns.EnsureRouting(p.h, netns.DefaultRouting()); err != nil {
			t.Fatal(err)
		}
		p.expect(t, p.Pod, spoofed(p.a.Peer), app)
	})
}

func TestLoopbackUntouched(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		p.enrol(t, p.spec())
		for _, dst := range []netip.Addr{p.a.Loopback, p.a.Pod} {
			r := p.expect(t, p.Pod, p.to(dst, appPort), app)
			if r.Listener == app && r.Local != netip.AddrPortFrom(dst, appPort) {
				t.Errorf("app accepted on %s; want %s", r.Local, netip.AddrPortFrom(dst, appPort))
			}
		}
	})
}

func TestProbeBypass(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		p.enrol(t, p.spec())
		d := p.to(p.a.Pod, appPort)
		d.From = netip.AddrPortFrom(p.a.Probe, 0)
		r := p.expect(t, p.Peer, d, app)
		if r.Listener == app && r.Remote.Addr() != p.a.Probe {
			t.Errorf("app saw the probe from %s; want %s", r.Remote.Addr(), p.a.Probe)
		}
		// The same peer from its ordinary address is captured.
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
		// Traffic from the pod to the probe address is not captured either.
		p.expect(t, p.Pod, p.to(p.a.Probe, serverPort), server)
	})
}

func TestExclusions(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		s := p.spec()
		s.ExcludeInboundPorts = []uint16{appExcludedPort}
		s.ExcludeOutboundPorts = []uint16{serverExcluded}
		s.ExcludeOutboundCIDRs = []netip.Prefix{
			netip.PrefixFrom(nstest.V4.Extra, 32),
			netip.PrefixFrom(nstest.V6.Extra, 128),
		}
		p.enrol(t, s)

		p.expect(t, p.Peer, p.to(p.a.Pod, appExcludedPort), app)
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)

		p.expect(t, p.Pod, p.to(p.a.Peer, serverExcluded), server)
		p.expect(t, p.Pod, p.to(p.a.Extra, serverPort), server)
		r := p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), nstest.ProxyOutbound)
		p.wantOutbound(t, r, nstest.ProxyOutbound, netip.AddrPortFrom(p.a.Peer, serverPort))
	})
}

func TestDNS(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		resolverAddr := netip.AddrPortFrom(p.a.Peer, dnsPort)
		udp := nstest.Dial{Network: p.v.udp(), To: resolverAddr}
		tcp := p.to(p.a.Peer, dnsPort)

		s := p.spec()
		s.CaptureDNS = true
		p.enrol(t, s)
		p.expect(t, p.Pod, udp, nstest.ProxyDNS)
		r := p.expect(t, p.Pod, tcp, nstest.ProxyDNS)
		p.wantOutbound(t, r, nstest.ProxyDNS, resolverAddr)
		// The proxy's own queries go upstream.
		marked := udp
		marked.Mark = proxyMark
		p.expect(t, p.Pod, marked, resolver)
		p.expect(t, p.Pod, p.proxyDial(p.a.Peer, dnsPort), resolver)

		s.CaptureDNS = false
		p.enrol(t, s)
		p.expect(t, p.Pod, udp, resolver)
		// Without DNS capture, TCP to port 53 is ordinary outbound TCP.
		r = p.expect(t, p.Pod, tcp, nstest.ProxyOutbound)
		p.wantOutbound(t, r, nstest.ProxyOutbound, resolverAddr)
	})
}

func TestIngressMode(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		s := p.spec()
		s.NoInboundCapture = true
		p.enrol(t, s)
		r := p.expect(t, p.Peer, p.to(p.a.Pod, appPort), app)
		if r.Listener == app && r.Local != netip.AddrPortFrom(p.a.Pod, appPort) {
			t.Errorf("app accepted on %s; want %s", r.Local, netip.AddrPortFrom(p.a.Pod, appPort))
		}
		p.expectFail(t, p.Peer, p.to(p.a.Pod, closedPort))
		r = p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), nstest.ProxyOutbound)
		p.wantOutbound(t, r, nstest.ProxyOutbound, netip.AddrPortFrom(p.a.Peer, serverPort))
		// The proxy's connections into the pod still get their replies.
		d := p.proxyDial(p.a.Pod, appPort)
		d.From = netip.AddrPortFrom(p.a.Peer, 0)
		p.expect(t, p.Pod, d, app)
	})
}

// observation is what the ip and nft binaries show of the pod's
// netfilter and routing state.
type observation struct {
	ruleset, rules4, rules6, routes4, routes6 string
}

func observe(t *testing.T, p *pod) observation {
	t.Helper()
	return observation{
		ruleset: p.Pod.Nft(t, "list", "ruleset"),
		rules4:  p.Pod.IP(t, "-4", "rule", "show"),
		rules6:  p.Pod.IP(t, "-6", "rule", "show"),
		routes4: p.Pod.IP(t, "-4", "route", "show", "table", "all"),
		routes6: p.Pod.IP(t, "-6", "route", "show", "table", "all"),
	}
}

func (o observation) diff(other observation) string {
	return cmp.Diff(o, other, cmp.AllowUnexported(observation{}))
}

func TestRemove(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		// Someone else's table, which must survive us.
		p.Pod.Nft(t, "add", "table", "inet", "other")
		p.Pod.Nft(t, "add", "chain", "inet", "other", "pre", "{ type filter hook prerouting priority 0; policy accept; }")
		p.Pod.Nft(t, "add", "rule", "inet", "other", "pre", "tcp dport 12345 counter")
		// Same name, other family: not ours either.
		p.Pod.Nft(t, "add", "table", "ip", nftTable)
		before := observe(t, p)

		rs := p.enrol(t, p.spec())
		if st, text := p.verify(t, rs); st != nft.StatusInSync {
			t.Errorf("Verify beside foreign tables: %s, want in sync\n%s", st, text)
		}
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
		p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), nstest.ProxyOutbound)

		for range 2 {
			p.release(t)
		}
		if st, text := p.verify(t, rs); st != nft.StatusAbsent {
			t.Errorf("Verify after Remove: %s, want absent\n%s", st, text)
		}
		after := observe(t, p)
		if strings.Contains(after.ruleset, "table inet "+nftTable+" ") {
			t.Errorf("our table is still there:\n%s", after.ruleset)
		}
		for _, s := range []string{after.rules4, after.rules6} {
			if strings.Contains(s, "fwmark 0x111") || strings.Contains(s, "lookup 100") {
				t.Errorf("our ip rule is still there:\n%s", s)
			}
		}
		for _, s := range []string{after.routes4, after.routes6} {
			if strings.Contains(s, "table 100") {
				t.Errorf("a route of table 100 is still there:\n%s", s)
			}
		}
		if d := before.diff(after); d != "" {
			t.Errorf("pod state after Remove differs from before enrolment (-before +after):\n%s", d)
		}
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), app)
		p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), server)
	})
}

// listTable is our table as nft lists it, with every counter's counts
// zeroed: traffic is not a difference between two listings.
func listTable(t *testing.T, p *pod) string {
	t.Helper()
	return countsRE.ReplaceAllString(p.Pod.Nft(t, "list", "table", "inet", nftTable), "counter packets 0 bytes 0")
}

var countsRE = regexp.MustCompile(`counter packets [0-9]+ bytes [0-9]+`)

func TestApplyTwice(t *testing.T) {
	forEachMode(t, func(t *testing.T, p *pod) {
		rs := p.enrol(t, p.spec())
		first := listTable(t, p)
		for i := range 2 {
			if err := p.nl.Apply(t.Context(), p.h, rs); err != nil {
				t.Fatalf("Apply #%d: %v", i+2, err)
			}
			if d := cmp.Diff(first, listTable(t, p)); d != "" {
				t.Errorf("listing after Apply #%d differs (-first +now):\n%s", i+2, d)
			}
		}
		if st, text := p.verify(t, rs); st != nft.StatusInSync {
			t.Errorf("Verify: %s, want in sync\n%s", st, text)
		}
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
	})
}

// TestStringMatchesListing: Ruleset.String promises nft's own rendering of
// the table, so logs and goldens can be compared with a live listing.
func TestStringMatchesListing(t *testing.T) {
	forEachMode(t, func(t *testing.T, p *pod) {
		for _, dns := range []bool{false, true} {
			s := p.spec()
			s.CaptureDNS = dns
			s.ExcludeInboundPorts = []uint16{appExcludedPort}
			s.ExcludeOutboundPorts = []uint16{serverExcluded}
			s.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16"), netip.MustParsePrefix("fd00:97::/64")}
			rs := p.enrol(t, s)
			if d := cmp.Diff(rs.String(), listTable(t, p)); d != "" {
				t.Errorf("CaptureDNS=%v: rs.String() differs from `nft list table` (-String +nft):\n%s", dns, d)
			}
		}
	})
}

var handleRE = regexp.MustCompile(`# handle (\d+)$`)

// ruleHandles returns the handles of the rules of chain, in order.
func ruleHandles(t *testing.T, p *pod, chain string) []string {
	t.Helper()
	var hs []string
	for _, l := range strings.Split(p.Pod.Nft(t, "-a", "list", "chain", "inet", nftTable, chain), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "type ") || strings.HasPrefix(l, "chain ") {
			continue
		}
		if m := handleRE.FindStringSubmatch(l); m != nil {
			hs = append(hs, m[1])
		}
	}
	if len(hs) == 0 {
		t.Fatalf("chain %s has no rules", chain)
	}
	return hs
}

var commentRE = regexp.MustCompile(`comment ("[^"]*")`)

// editInPlace replaces the first rule of chain whose text contains sub
// with "meta l4proto tcp accept", keeping its comment.
func editInPlace(t *testing.T, p *pod, chain, sub string) {
	t.Helper()
	for _, l := range strings.Split(p.Pod.Nft(t, "-a", "list", "chain", "inet", nftTable, chain), "\n") {
		h := handleRE.FindStringSubmatch(l)
		c := commentRE.FindStringSubmatch(l)
		if h != nil && c != nil && strings.Contains(l, sub) {
			p.Pod.Nft(t, "replace", "rule", "inet", nftTable, chain, "handle", h[1], "meta", "l4proto", "tcp", "accept", "comment", c[1])
			return
		}
	}
	t.Fatalf("no rule with %q in chain %s", sub, chain)
}

func TestTamperRestored(t *testing.T) {
	nstest.RequirePrivileged(t)
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, p *pod)
		want   nft.Status
	}{
		{"rule deleted", func(t *testing.T, p *pod) {
			hs := ruleHandles(t, p, "nat-output")
			p.Pod.Nft(t, "delete", "rule", "inet", nftTable, "nat-output", "handle", hs[len(hs)-1])
		}, nft.StatusDrifted},
		{"rule added", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "insert", "rule", "inet", nftTable, "nat-output", "meta l4proto tcp accept")
		}, nft.StatusDrifted},
		{"rule appended", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "add", "rule", "inet", nftTable, "mangle-output", "counter")
		}, nft.StatusDrifted},
		{"rule replaced", func(t *testing.T, p *pod) {
			hs := ruleHandles(t, p, "nat-output")
			p.Pod.Nft(t, "replace", "rule", "inet", nftTable, "nat-output", "handle", hs[len(hs)-1], "meta l4proto tcp accept")
		}, nft.StatusDrifted},
		// The same position and comment, but "meta l4proto tcp accept"
		// in place of the capture: only the expressions tell.
		{"outbound rule edited in place", func(t *testing.T, p *pod) {
			editInPlace(t, p, "nat-output", fmt.Sprintf("redirect to :%d", defaults.OutboundPort))
			p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), server)
		}, nft.StatusDrifted},
		{"inbound rule edited in place", func(t *testing.T, p *pod) {
			chain := "mangle-prerouting"
			if p.v.mode == nft.ModeRedirect {
				chain = "nat-prerouting"
			}
			editInPlace(t, p, chain, fmt.Sprintf(":%d", defaults.InboundPort))
			p.expect(t, p.Peer, p.to(p.a.Pod, appPort), app)
		}, nft.StatusDrifted},
		{"chain flushed", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "flush", "chain", "inet", nftTable, "nat-output")
		}, nft.StatusDrifted},
		{"chain deleted", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "flush", "chain", "inet", nftTable, "nat-output")
			p.Pod.Nft(t, "delete", "chain", "inet", nftTable, "nat-output")
		}, nft.StatusDrifted},
		{"chain added", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "add", "chain", "inet", nftTable, "extra", "{ type filter hook input priority 0; policy accept; }")
		}, nft.StatusDrifted},
		{"policy changed", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "add", "chain", "inet", nftTable, "mangle-output", "{ type route hook output priority mangle + 10; policy drop; }")
		}, nft.StatusDrifted},
		{"table made dormant", func(t *testing.T, p *pod) {
			// Every chain and rule stays in place, but none of them runs.
			p.Pod.Nft(t, "add", "table", "inet", nftTable, "{ flags dormant; }")
			p.expect(t, p.Peer, p.to(p.a.Pod, appPort), app)
		}, nft.StatusDrifted},
		{"table deleted", func(t *testing.T, p *pod) {
			p.Pod.Nft(t, "delete", "table", "inet", nftTable)
		}, nft.StatusAbsent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachMode(t, func(t *testing.T, p *pod) {
				rs := p.enrol(t, p.spec())
				want := listTable(t, p)
				tc.tamper(t, p)
				if st, text := p.verify(t, rs); st != tc.want {
					t.Errorf("Verify after tampering: %s, want %s\n%s", st, tc.want, text)
				}
				if err := p.nl.Apply(t.Context(), p.h, rs); err != nil {
					t.Fatalf("Apply over the tampered table: %v", err)
				}
				if st, text := p.verify(t, rs); st != nft.StatusInSync {
					t.Errorf("Verify after re-Apply: %s, want in sync\n%s", st, text)
				}
				if d := cmp.Diff(want, listTable(t, p)); d != "" {
					t.Errorf("listing after re-Apply differs from the untampered one (-want +got):\n%s", d)
				}
				p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
				p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), nstest.ProxyOutbound)
			})
		})
	}
}

// withBadRule returns rs with one more rule in its first chain: a jump to
// a chain that does not exist, which the kernel refuses at commit.
func withBadRule(rs *nft.Ruleset) *nft.Ruleset {
	bad := *rs
	bad.Chains = append([]nft.Chain(nil), rs.Chains...)
	first := bad.Chains[0]
	first.Rules = append(append([]nft.Rule(nil), first.Rules...), nft.Rule{
		Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "no-such-chain"}},
		Text:  "jump no-such-chain",
	})
	bad.Chains[0] = first
	return &bad
}

func TestFailedBatchKeepsTable(t *testing.T) {
	forEachMode(t, func(t *testing.T, p *pod) {
		// With no table yet: the failed batch must not leave one behind.
		s := p.spec()
		if err := p.nl.Apply(t.Context(), p.h, withBadRule(build(t, s))); err == nil {
			t.Fatal("Apply of a ruleset with a jump to a missing chain succeeded")
		}
		if out := p.Pod.Nft(t, "list", "ruleset"); strings.Contains(out, "table inet "+nftTable) {
			t.Errorf("a failed first Apply left a table:\n%s", out)
		}

		rs := p.enrol(t, s)
		want := listTable(t, p)
		// A different spec, so a partial commit would show.
		other := s
		other.CaptureDNS = true
		other.ExcludeInboundPorts = []uint16{appPort}
		if err := p.nl.Apply(t.Context(), p.h, withBadRule(build(t, other))); err == nil {
			t.Fatal("Apply of a ruleset with a jump to a missing chain succeeded")
		}
		if d := cmp.Diff(want, listTable(t, p)); d != "" {
			t.Errorf("a failed Apply changed the table (-before +after):\n%s", d)
		}
		if st, text := p.verify(t, rs); st != nft.StatusInSync {
			t.Errorf("Verify after a failed Apply: %s, want in sync\n%s", st, text)
		}
		p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
	})
}

// TestReapplyChangedSpec: re-enrolling with other options replaces the
// table whole, even when chains appear, disappear or change.
func TestReapplyChangedSpec(t *testing.T) {
	forEach(t, func(t *testing.T, p *pod) {
		first := p.enrol(t, p.spec())
		s := p.spec()
		s.Mode = nft.ModeRedirect
		if p.v.mode == nft.ModeRedirect {
			s.Mode = nft.ModeTProxy
		}
		s.CaptureDNS = true
		second := p.enrol(t, s)
		if st, _ := p.verify(t, second); st != nft.StatusInSync {
			t.Errorf("Verify(new spec) = %s, want in sync", st)
		}
		if st, _ := p.verify(t, first); st != nft.StatusDrifted {
			t.Errorf("Verify(old spec) = %s, want drifted", st)
		}
		r := p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
		wantInbound(t, s.Mode, r, netip.AddrPortFrom(p.a.Pod, appPort))
		p.expect(t, p.Pod, nstest.Dial{Network: p.v.udp(), To: netip.AddrPortFrom(p.a.Peer, dnsPort)}, nstest.ProxyDNS)
	})
}

// TestFailsClosedWithoutProxy: with capture in place but no proxy
// listening (it crashed, or is restarting), new inbound connections must
// not reach the application uncaptured; they succeed through the proxy as
// soon as it listens again.
func TestFailsClosedWithoutProxy(t *testing.T) {
	nstest.RequirePrivileged(t)
	for _, v := range variants {
		t.Run(v.String(), func(t *testing.T) {
			if v.v6 && !nstest.HaveIPv6() {
				t.Skip("kernel without IPv6")
			}
			t.Parallel()
			p := newPodWithoutProxy(t, v)
			p.enrol(t, p.spec())
			p.expectFail(t, p.Peer, p.to(p.a.Pod, appPort))
			nstest.StartProxy(t, p.Pod, p.rec, nstest.DefaultProxyPorts)
			p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
		})
	}
}
