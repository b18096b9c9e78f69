package nstest

import (
	"net/netip"
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
)

// Names the stand-in proxy's listeners answer with.
const (
	ProxyOutbound = "proxy-outbound"
	ProxyInbound  = "proxy-inbound"
	ProxyHBONE    = "proxy-hbone"
	ProxyDNS      = "proxy-dns"
)

// ProxyPorts are the ports the stand-in proxy listens on.
type ProxyPorts struct {
	Outbound, Inbound, HBONE, DNS uint16
	// Mark is what the proxy sets on its sockets (SO_MARK).
	Mark uint32
}

// DefaultProxyPorts are the daemon's defaults, ztunnel's.
var DefaultProxyPorts = ProxyPorts{
	Outbound: defaults.OutboundPort, Inbound: defaults.InboundPort, HBONE: defaults.HBONEPort, DNS: defaults.DNSPort,
	Mark: defaults.ProxyMark,
}

// StartProxy starts a stand-in for the node proxy inside ns, shaped like
// ztunnel's in-pod listeners: dual-stack [::] TCP listeners on the
// outbound, inbound and HBONE ports, transparent (TPROXY delivers only to
// transparent sockets) and carrying the proxy mark; DNS on TCP [::] and on
// UDP bound to each loopback address, so a UDP reply leaves from the
// address the query was redirected to and conntrack can undo the NAT.
func StartProxy(t testing.TB, ns *Netns, rec *Recorder, p ProxyPorts) {
	t.Helper()
	opts := Sockopts{Mark: p.Mark, Transparent: true}
	for _, l := range []struct {
		name string
		port uint16
	}{
		{ProxyOutbound, p.Outbound},
		{ProxyInbound, p.Inbound},
		{ProxyHBONE, p.HBONE},
		{ProxyDNS, p.DNS},
	} {
		ns.Listen(t, rec, Listen{Name: l.name, Network: tcpAny(), Addr: netip.AddrPortFrom(anyAddr(), l.port), Sockopts: opts})
	}
	ns.Listen(t, rec, Listen{Name: ProxyDNS, Network: "udp4", Addr: netip.AddrPortFrom(V4.Loopback, p.DNS), Sockopts: opts})
	if HaveIPv6() {
		ns.Listen(t, rec, Listen{Name: ProxyDNS, Network: "udp6", Addr: netip.AddrPortFrom(V6.Loopback, p.DNS), Sockopts: opts})
	}
}

// StartTCP starts a plain TCP listener named name on every address of ns
// (dual-stack) for each port: an application in the pod, or a server in the
// peer.
func StartTCP(t testing.TB, ns *Netns, rec *Recorder, name string, ports ...uint16) {
	t.Helper()
	for _, port := range ports {
		ns.Listen(t, rec, Listen{Name: name, Network: tcpAny(), Addr: netip.AddrPortFrom(anyAddr(), port)})
	}
}

// StartUDP starts a plain UDP listener named name bound to each of addrs
// (bound, not wildcard, so replies leave from the address that was asked).
func StartUDP(t testing.TB, ns *Netns, rec *Recorder, name string, addrs ...netip.AddrPort) {
	t.Helper()
	for _, a := range addrs {
		network := "udp4"
		if a.Addr().Is6() {
			network = "udp6"
		}
		ns.Listen(t, rec, Listen{Name: name, Network: network, Addr: a})
	}
}

func tcpAny() string {
	if HaveIPv6() {
		return "tcp"
	}
	return "tcp4"
}

func anyAddr() netip.Addr {
	if HaveIPv6() {
		return V6.Any
	}
	return V4.Any
}
