package nstest

import (
	"net/netip"
	"os"
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
)

// Addrs are the addresses of one family in a Pair. Every pair uses the same
// ones: each lives in its own namespaces, so they never meet.
type Addrs struct {
	// Pod and Peer are the two ends of the veth pair.
	Pod, Peer netip.Addr
	// Extra is a second address of the peer, outside the veth subnet and
	// reached through the pod's default route: a destination that an
	// excluded CIDR can cover while Peer stays captured.
	Extra netip.Addr
	// Probe is the kubelet probe source, configured on the peer so that the
	// peer can connect from it.
	Probe netip.Addr
	// Routed is inside a prefix the peer routes through the pod although
	// the pod owns no address in it: only TPROXY's mark and local route
	// (or NAT) can deliver such a packet to a socket in the pod.
	Routed netip.Addr
	// Loopback is 127.0.0.1 or ::1.
	Loopback netip.Addr
	// Any is the unspecified address, for bound-to-all sockets.
	Any netip.Addr
}

// V4 and V6 are the addresses of every Pair.
var (
	V4 = Addrs{
		Pod:      netip.MustParseAddr("10.99.0.2"),
		Peer:     netip.MustParseAddr("10.99.0.1"),
		Extra:    netip.MustParseAddr("10.97.0.1"),
		Probe:    defaults.ProbeSourceV4(),
		Routed:   netip.MustParseAddr("10.98.0.5"),
		Loopback: netip.MustParseAddr("127.0.0.1"),
		Any:      netip.IPv4Unspecified(),
	}
	V6 = Addrs{
		Pod:      netip.MustParseAddr("fd00:99::2"),
		Peer:     netip.MustParseAddr("fd00:99::1"),
		Extra:    netip.MustParseAddr("fd00:97::1"),
		Probe:    defaults.ProbeSourceV6(),
		Routed:   netip.MustParseAddr("fd00:98::5"),
		Loopback: netip.IPv6Loopback(),
		Any:      netip.IPv6Unspecified(),
	}
)

// Family returns V6 when v6 is set and V4 otherwise.
func Family(v6 bool) Addrs {
	if v6 {
		return V6
	}
	return V4
}

// Pair is a pod namespace and a peer namespace joined by a veth pair
// (eth0 on both sides), with IPv4 and IPv6 addresses.
//
//	pod  eth0 10.99.0.2/24 fd00:99::2/64, default routes via the peer
//	peer eth0 10.99.0.1/24 fd00:99::1/64, plus Extra and Probe addresses,
//	     routes to 10.98.0.0/24 and fd00:98::/64 via the pod
type Pair struct {
	Pod, Peer *Netns
}

// NewPair creates the two namespaces and the link between them. All of it
// is removed when the test ends.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := &Pair{Pod: NewNetns(t), Peer: NewNetns(t)}
	if HaveIPv6() {
		// Without DAD the links' own link-local addresses (and their local
		// routes) are final at once, so the namespaces' routing looks the
		// same at every point of a test.
		p.Pod.Sysctl(t, "ipv6.conf.default.accept_dad", "0")
		p.Peer.Sysctl(t, "ipv6.conf.default.accept_dad", "0")
	}
	// IPv6 addresses are nodad so they are usable at once: the tests start
	// before duplicate address detection would have finished.
	pod := []string{
		"link add eth0 type veth peer name eth0 netns " + p.Peer.Name,
		"addr add " + V4.Pod.String() + "/24 dev eth0",
		"link set eth0 up",
		"route add default via " + V4.Peer.String(),
	}
	peer := []string{
		"addr add " + V4.Peer.String() + "/24 dev eth0",
		"addr add " + V4.Extra.String() + "/32 dev eth0",
		"addr add " + V4.Probe.String() + "/32 dev eth0",
		"link set eth0 up",
		"route add 10.98.0.0/24 via " + V4.Pod.String(),
	}
	if HaveIPv6() {
		// nodad: the tests start before duplicate address detection would
		// have finished, and a tentative address cannot be bound.
		pod = append(pod,
			"addr add "+V6.Pod.String()+"/64 dev eth0 nodad",
			"route add default via "+V6.Peer.String(),
		)
		peer = append(peer,
			"addr add "+V6.Peer.String()+"/64 dev eth0 nodad",
			"addr add "+V6.Extra.String()+"/128 dev eth0 nodad",
			"addr add "+V6.Probe.String()+"/128 dev eth0 nodad",
			"route add fd00:98::/64 via "+V6.Pod.String(),
		)
	}
	p.Pod.IPBatch(t, pod...)
	p.Peer.IPBatch(t, peer...)
	return p
}

// HaveIPv6 reports whether the kernel has IPv6 at all; tests of the IPv6
// data path skip without it.
func HaveIPv6() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}
