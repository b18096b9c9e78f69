// Package nft turns a pod's capture spec into the nftables ruleset nftredir
// owns inside the pod's network namespace, applies it in one netlink batch,
// and tells whether what is in the kernel still matches.
//
// It is also the one nftables engine of the project: a Table (the pod's,
// or the node's probe table that package probe builds) is assembled from
// the same words, applied by the same batches (Plan, Replace), read back
// by ReadLive and compared by Live.Problems.
//
// Building is pure: Build reads no files and opens no sockets, so the
// ruleset can be rendered, logged and golden-tested anywhere. Only the
// batches' Queue and ReadLive talk to the kernel, on connections the
// caller opened.
package nft

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/nftredir/nftredir/internal/defaults"
)

// TableName is the one inet table nftredir owns in every pod namespace.
// Nothing else in the namespace is ever read-modify-written.
const TableName = "nftredir"

// Mode selects how inbound TCP reaches the proxy; the modes, their names
// and their parsing are defaults.CaptureMode's.
type Mode = defaults.CaptureMode

// The modes under the builder's names.
const (
	ModeTProxy   = defaults.TProxy
	ModeRedirect = defaults.Redirect
)

// Mark is a packet or connection mark under a mask: only the masked bits
// are matched or set, so other users of the mark keep their bits.
type Mark struct {
	Value uint32
	Mask  uint32
}

func (m Mark) validate(name string) error {
	if m.Mask == 0 {
		return fmt.Errorf("%s mask must not be zero", name)
	}
	if m.Value&^m.Mask != 0 {
		return fmt.Errorf("%s %#x has bits outside its mask %#x", name, m.Value, m.Mask)
	}
	if m.Value == 0 {
		return fmt.Errorf("%s must not be zero (unmarked packets would match)", name)
	}
	return nil
}

// Limits on list sizes: one rule is emitted per entry, and a request that
// asks for thousands is a mistake, not a configuration.
const (
	MaxExcludedPorts     = 64
	MaxExcludedCIDRs     = 64
	MaxRerouteInterfaces = 16
)

// Spec is everything the ruleset depends on. Two equal Specs build
// identical rulesets.
type Spec struct {
	// PodID tags every rule (in its comment) so `nft list` shows whose
	// rules they are.
	PodID string
	Mode  Mode

	// The proxy's ports; DefaultSpec takes them from package defaults.
	OutboundPort     uint16 // outgoing TCP is redirected here
	InboundPort      uint16 // incoming plaintext TCP goes here
	InboundHBONEPort uint16 // incoming tunnel TCP goes here
	DNSPort          uint16 // DNS goes here when CaptureDNS

	ProxyMark  Mark // set by the proxy on its own sockets
	TProxyMark Mark // set on tproxied packets and proxy connections

	// ProbeSourceV4/V6: kubelet probes SNATed to these on the node bypass
	// capture. A zero address omits the rule for that family.
	ProbeSourceV4 netip.Addr
	ProbeSourceV6 netip.Addr

	// TProxyAddrV4 and TProxyAddrV6 are where TPROXY mode hands inbound
	// TCP (both the plaintext and the HBONE port): the address the
	// proxy's transparent listener is looked up at. Loopback (the
	// default, as Istio's in-pod rules use) reaches listeners bound to
	// loopback and to the wildcard address alike; the accepted socket's
	// local address is still the original destination, and the packet's
	// destination is not rewritten, so no route_localnet is needed. A zero
	// address leaves the choice to the kernel: the incoming interface's
	// primary address for IPv4 and the packet's destination for IPv6,
	// which only wildcard listeners serve.
	TProxyAddrV4 netip.Addr
	TProxyAddrV6 netip.Addr

	CaptureDNS bool
	// IPv6 captures IPv6 as well as IPv4. Off, IPv6 traffic passes
	// untouched.
	IPv6 bool
	// NoInboundCapture is the "ingress" mode: only outbound is captured.
	NoInboundCapture bool

	ExcludeInboundPorts  []uint16
	ExcludeOutboundPorts []uint16
	ExcludeOutboundCIDRs []netip.Prefix

	// RerouteInterfaces names interfaces in the pod whose incoming TCP is
	// the pod's outbound traffic (a VM's or nested containers' behind a
	// bridge or tap in the pod): redirected to OutboundPort, never
	// captured as inbound. Istio's istio.io/reroute-virtual-interfaces.
	RerouteInterfaces []string
}

// DefaultSpec is the ztunnel-compatible spec for podID, every value from
// package defaults.
func DefaultSpec(podID string) Spec {
	return Spec{
		PodID:            podID,
		Mode:             defaults.Mode,
		OutboundPort:     defaults.OutboundPort,
		InboundPort:      defaults.InboundPort,
		InboundHBONEPort: defaults.HBONEPort,
		DNSPort:          defaults.DNSPort,
		ProxyMark:        Mark{Value: defaults.ProxyMark, Mask: defaults.MarkMask},
		TProxyMark:       Mark{Value: defaults.TProxyMark, Mask: defaults.MarkMask},
		ProbeSourceV4:    defaults.ProbeSourceV4(),
		ProbeSourceV6:    defaults.ProbeSourceV6(),
		TProxyAddrV4:     defaults.TProxyAddrV4(),
		TProxyAddrV6:     defaults.TProxyAddrV6(),
		CaptureDNS:       defaults.CaptureDNS,
		IPv6:             defaults.IPv6,
		NoInboundCapture: !defaults.InboundCapture,
	}
}

// Validate checks the spec without touching the kernel; Build calls it.
func (s Spec) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := defaults.CheckPodUID(s.PodID); err != nil {
		add("pod id %v", err)
	}
	if s.Mode != ModeTProxy && s.Mode != ModeRedirect {
		add("unknown capture mode %d", int(s.Mode))
	}
	ports := map[string]uint16{
		"outbound port": s.OutboundPort, "inbound port": s.InboundPort,
		"inbound HBONE port": s.InboundHBONEPort,
	}
	if s.CaptureDNS {
		ports["DNS port"] = s.DNSPort
	}
	seen := map[uint16]string{}
	for _, name := range slices.Sorted(maps.Keys(ports)) {
		p := ports[name]
		if p == 0 {
			add("%s must be set", name)
			continue
		}
		if other, dup := seen[p]; dup {
			add("%s and %s are both %d", other, name, p)
		}
		seen[p] = name
	}
	if err := s.ProxyMark.validate("proxy mark"); err != nil {
		errs = append(errs, err)
	}
	if err := s.TProxyMark.validate("tproxy mark"); err != nil {
		errs = append(errs, err)
	}
	if s.ProxyMark.Mask&s.TProxyMark.Mask != 0 && s.ProxyMark.Value&s.TProxyMark.Mask == s.TProxyMark.Value&s.ProxyMark.Mask {
		add("proxy mark %#x and tproxy mark %#x are indistinguishable", s.ProxyMark.Value, s.TProxyMark.Value)
	}
	if s.ProbeSourceV4.IsValid() && !s.ProbeSourceV4.Is4() {
		add("IPv4 probe source %s is not an IPv4 address", s.ProbeSourceV4)
	}
	if s.ProbeSourceV6.IsValid() && (!s.ProbeSourceV6.Is6() || s.ProbeSourceV6.Is4In6()) {
		add("IPv6 probe source %s is not an IPv6 address", s.ProbeSourceV6)
	}
	if a := s.TProxyAddrV4; a.IsValid() && (!a.Is4() || a.IsUnspecified() || a.IsMulticast()) {
		add("IPv4 tproxy address %s is not an IPv4 unicast address", a)
	}
	if a := s.TProxyAddrV6; a.IsValid() && (!a.Is6() || a.Is4In6() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast()) {
		add("IPv6 tproxy address %s is not an IPv6 unicast address without zone", a)
	}
	checkPorts := func(name string, ps []uint16) {
		if len(ps) > MaxExcludedPorts {
			add("%d %s, at most %d allowed", len(ps), name, MaxExcludedPorts)
		}
		for _, p := range ps {
			if p == 0 {
				add("%s: port 0 is not a port", name)
			}
		}
	}
	checkPorts("excluded inbound ports", s.ExcludeInboundPorts)
	checkPorts("excluded outbound ports", s.ExcludeOutboundPorts)
	if len(s.ExcludeOutboundCIDRs) > MaxExcludedCIDRs {
		add("%d excluded outbound CIDRs, at most %d allowed", len(s.ExcludeOutboundCIDRs), MaxExcludedCIDRs)
	}
	for _, c := range s.ExcludeOutboundCIDRs {
		switch {
		case !c.IsValid():
			add("excluded outbound CIDR %v is invalid", c)
		case c.Addr().Is4In6():
			add("excluded outbound CIDR %s: write IPv4 ranges in IPv4 form", c)
		case c != c.Masked():
			add("excluded outbound CIDR %s has host bits set (did you mean %s?)", c, c.Masked())
		case c.Addr().Is6() && !s.IPv6:
			add("excluded outbound CIDR %s is IPv6 but IPv6 capture is off", c)
		}
	}
	if len(s.RerouteInterfaces) > MaxRerouteInterfaces {
		add("%d reroute interfaces, at most %d allowed", len(s.RerouteInterfaces), MaxRerouteInterfaces)
	}
	for _, name := range s.RerouteInterfaces {
		if err := CheckInterfaceName(name); err != nil {
			add("reroute interface %v", err)
		}
	}
	return errors.Join(errs...)
}

// ifNameMax is the longest interface name the kernel takes: IFNAMSIZ (16)
// less the terminating NUL.
const ifNameMax = 15

// CheckInterfaceName accepts the names a rerouted interface may have: what
// the kernel allows (1-15 bytes, not "." or "..", no '/', ':' or space),
// narrowed to ASCII letters, digits, '-', '_' and '.', so that no name
// reads as an nft wildcard ('*') or needs quoting anywhere. "lo" is
// refused: rerouting loopback would send the proxy's own connections to
// the app back to the proxy.
func CheckInterfaceName(name string) error {
	switch {
	case name == "":
		return errors.New("name is empty")
	case len(name) > ifNameMax:
		return fmt.Errorf("%q is %d bytes; interface names have at most %d", name, len(name), ifNameMax)
	case name == "." || name == "..":
		return fmt.Errorf("%q is not an interface name", name)
	case name == "lo":
		return errors.New(`"lo" cannot be rerouted: the proxy reaches the app over loopback`)
	}
	for _, r := range name {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("%q contains %q; use ASCII letters, digits, '-', '_' and '.'", name, r)
		}
	}
	return nil
}
