package e2e

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/nft"
)

// startLoopbackProxy is a node proxy whose transparent inbound and HBONE
// listeners are bound to loopback (127.0.0.1 and ::1), as a proxy written
// for Istio's in-pod rules (`-j TPROXY --on-ip 127.0.0.1`) binds them.
func startLoopbackProxy(t *testing.T, p *pod) {
	t.Helper()
	opts := nstest.Sockopts{Mark: proxyMark, Transparent: true}
	fams := []nstest.Addrs{nstest.V4}
	networks := []string{"tcp4"}
	if nstest.HaveIPv6() {
		fams, networks = append(fams, nstest.V6), append(networks, "tcp6")
	}
	for i, a := range fams {
		for _, l := range []struct {
			name string
			port uint16
		}{{nstest.ProxyInbound, nstest.DefaultProxyPorts.Inbound}, {nstest.ProxyHBONE, nstest.DefaultProxyPorts.HBONE}} {
			p.Pod.Listen(t, p.rec, nstest.Listen{Name: l.name, Network: networks[i], Addr: netip.AddrPortFrom(a.Loopback, l.port), Sockopts: opts})
		}
	}
}

// TestTproxyTargetAddress: with the default target (loopback), inbound TCP
// reaches the proxy whether its transparent listeners are bound to
// loopback or to the wildcard address, in both families, and the accepted
// socket still has the original destination as its local address. With
// no target address (the packet's destination, the former rule), the
// loopback-bound proxy gets nothing and the fail-closed drop takes the
// connection: that is what the option is for.
func TestTproxyTargetAddress(t *testing.T) {
	nstest.RequirePrivileged(t)
	for _, v6 := range []bool{false, true} {
		v := variant{v6: v6, mode: nft.ModeTProxy}
		for _, listeners := range []string{"loopback listeners", "wildcard listeners"} {
			for _, target := range []string{"loopback target", "destination target"} {
				t.Run(v.String()+"/"+listeners+"/"+target, func(t *testing.T) {
					if v6 && !nstest.HaveIPv6() {
						t.Skip("kernel without IPv6")
					}
					t.Parallel()
					p := newPodWithoutProxy(t, v)
					if listeners == "loopback listeners" {
						startLoopbackProxy(t, p)
					} else {
						nstest.StartProxy(t, p.Pod, p.rec, nstest.DefaultProxyPorts)
					}
					s := p.spec()
					if target == "destination target" {
						s.TProxyAddrV4, s.TProxyAddrV6 = netip.Addr{}, netip.Addr{}
					}
					p.enrol(t, s)
					// The destination stays the pod's address and only the
					// listener lookup uses loopback, so loopback delivery
					// needs no route_localnet (off in the pod).
					for l := range strings.Lines(p.Pod.Run(t, "sh", "-c", "cat /proc/sys/net/ipv4/conf/*/route_localnet")) {
						if strings.TrimSpace(l) != "0" {
							t.Fatalf("route_localnet is on in the pod; the test must show it is not needed")
						}
					}

					app := netip.AddrPortFrom(p.a.Pod, appPort)
					hbone := netip.AddrPortFrom(p.a.Pod, nstest.DefaultProxyPorts.HBONE)
					if listeners == "loopback listeners" && target == "destination target" {
						p.expectFail(t, p.Peer, p.to(p.a.Pod, appPort))
						p.expectFail(t, p.Peer, p.to(p.a.Pod, nstest.DefaultProxyPorts.HBONE))
						return
					}
					r := p.expect(t, p.Peer, p.to(p.a.Pod, appPort), nstest.ProxyInbound)
					wantInbound(t, nft.ModeTProxy, r, app)
					if r := p.expect(t, p.Peer, p.to(p.a.Pod, nstest.DefaultProxyPorts.HBONE), nstest.ProxyHBONE); r.Listener == nstest.ProxyHBONE && r.Local != hbone {
						t.Errorf("HBONE accepted with local address %s; want the original destination %s", r.Local, hbone)
					}
				})
			}
		}
	}
}
