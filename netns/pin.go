package netns

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// OpenPin opens a namespace pin a container runtime made (a bind mount of
// nsfs such as /var/run/netns/cni-<id>) with Open's checks and bounds,
// except that the last component of path is never followed: a symlink
// dropped among the pins is refused (ErrNotNetns) instead of leading to
// whatever namespace it names, /proc/PID/ns/net of a process included.
// A pin is a file the runtime made for one sandbox; a link is not.
func (g *Guard) OpenPin(path string) (*Handle, error) {
	return g.openBounded(path, unix.O_NOFOLLOW)
}

// InterfaceAddrs lists the addresses of global scope assigned to the
// namespace's interfaces, loopback interfaces left out: the addresses
// the namespace answers on from outside, such as a pod's IPs on its eth0.
// An address on lo proves nothing about whose namespace it is, since any
// process inside may put any address there.
func InterfaceAddrs(h *Handle) ([]netip.Addr, error) {
	var out []netip.Addr
	err := h.withRoute(func(nh *netlink.Handle) error {
		links, err := nh.LinkList()
		if err != nil {
			return fmt.Errorf("list links in %s: %w", h.path, err)
		}
		loop := map[int]bool{}
		for _, l := range links {
			if a := l.Attrs(); a.RawFlags&unix.IFF_LOOPBACK != 0 {
				loop[a.Index] = true
			}
		}
		addrs, err := nh.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses in %s: %w", h.path, err)
		}
		for _, a := range addrs {
			if loop[a.LinkIndex] || a.Scope != unix.RT_SCOPE_UNIVERSE || a.IPNet == nil {
				continue
			}
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			out = append(out, ip.Unmap())
		}
		return nil
	})
	return out, err
}
