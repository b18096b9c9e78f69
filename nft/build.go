package nft

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Priorities. iptables (legacy and iptables-nft alike) hooks its raw
// tables at -300, mangle at -150 and nat at -100 (dstnat; -100 on output
// too), and istio-cni's own nftables tables use the same numbers. Chains of
// equal priority on one hook run in the order they were created, which
// nobody controls, so each of ours sits 10 away, on the side where its
// decision is the one that holds:
//
//   - raw -310, before iptables' raw: conntrack takes the zone of the
//     first template attached to a packet (nft's `ct zone set` and
//     iptables' CT both leave a packet that has one alone), so the first
//     chain wins. Still after defrag (-400).
//   - mangle -140, after iptables' mangle: a mark or a tproxy socket
//     assignment is overwritten by whoever comes later, so the last chain
//     wins. Still after conntrack (-200), so ct state and ct mark are
//     known, and before NAT.
//   - nat -110, before iptables' nat: for a new connection the first nat
//     chain that sets up a translation wins, and later ones are not
//     consulted (nf_nat_inet_fn), so our redirect is the one that holds.
//     What we let through (the proxy's own traffic, probes, excluded
//     ports) still meets the other nat chains.
//
// Ours wins because a pod we enrol is ours to capture: a rule of someone
// else's that redirects, re-marks or re-zones the same packets can only
// hand them to a proxy that is not the one the pod was enrolled with.
// Other agents' capture is removed, or the pod refused, before our table
// goes in (see Foreign); these priorities settle what is left, a CNI's own
// rules, deterministically.
const (
	PriorityRaw    = -310
	PriorityMangle = -140
	PriorityNAT    = -110
)

var (
	// Skips conntrack for nothing; it only moves DNS between the proxy and
	// the upstream resolver into their own conntrack zone, so the proxy's
	// query cannot collide with the app's redirected one. Must run before
	// conntrack (-200).
	rawPrerouting = baseChain{"raw-prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, PriorityRaw}
	rawOutput     = baseChain{"raw-output", nftables.ChainTypeFilter, nftables.ChainHookOutput, PriorityRaw}
	// Runs after conntrack so ct mark and ct state are known, before NAT.
	// TPROXY mode does its inbound capture here.
	manglePrerouting = baseChain{"mangle-prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, PriorityMangle}
	// A route chain: changing the mark re-routes the packet, which is how
	// replies restored to the tproxy mark find table 100.
	mangleOutput = baseChain{"mangle-output", nftables.ChainTypeRoute, nftables.ChainHookOutput, PriorityMangle}
	// REDIRECT mode's inbound capture.
	natPrerouting = baseChain{"nat-prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, PriorityNAT}
	// Outbound capture in both modes.
	natOutput = baseChain{"nat-output", nftables.ChainTypeNAT, nftables.ChainHookOutput, PriorityNAT}
)

// Build turns a spec into the ruleset for our table. It does no I/O.
func Build(s Spec) (*Ruleset, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("invalid spec for pod %q: %w", s.PodID, err)
	}
	b := builder{spec: s}
	if s.CaptureDNS {
		b.rawPrerouting()
		b.rawOutput()
	}
	b.manglePrerouting()
	b.mangleOutput()
	if s.Mode == ModeRedirect && !s.NoInboundCapture || len(s.RerouteInterfaces) > 0 {
		b.natPrerouting()
	}
	b.natOutput()

	rs := &Ruleset{Spec: s, Table: Table{
		Name: TableName, Family: nftables.TableFamilyINet,
		ID: s.PodID, Label: commentPodPrefix + s.PodID, Chains: b.chains,
	}}
	if err := rs.Encode(); err != nil {
		return nil, fmt.Errorf("build for pod %q: %w", s.PodID, err)
	}
	return rs, nil
}

// WithoutCounters is rs with every rule's counter left out (and its own
// digest): what the table was before rules counted, for measuring what
// the counters cost (make bench). The daemon never programs it.
func (rs *Ruleset) WithoutCounters() (*Ruleset, error) {
	t, err := rs.Table.WithoutCounters()
	if err != nil {
		return nil, err
	}
	return &Ruleset{Spec: rs.Spec, Table: *t}, nil
}

type builder struct {
	spec   Spec
	chains []Chain
}

func (b *builder) chain(c baseChain, rules ...Rule) {
	b.chains = append(b.chains, c.with(rules...))
}

func (b *builder) rawPrerouting() {
	s := b.spec
	b.chain(rawPrerouting,
		// Upstream DNS replies to the proxy join the proxy's zone.
		// nft: meta mark & 0x00000fff != 0x00000539 udp sport 53 ct zone set 1
		NewRule(markIs(s.ProxyMark, false), portMatch(unix.IPPROTO_UDP, "udp", 53, true), setCtZone(1)),
	)
}

func (b *builder) rawOutput() {
	s := b.spec
	b.chain(rawOutput,
		// The proxy's own DNS queries go to zone 1.
		// nft: meta mark & 0x00000fff == 0x00000539 udp dport 53 ct zone set 1
		NewRule(markIs(s.ProxyMark, true), portMatch(unix.IPPROTO_UDP, "udp", 53, false), setCtZone(1)),
	)
}

// probeAddrs lists the probe addresses for the families we capture.
func (b *builder) probeAddrs() []netip.Addr {
	var out []netip.Addr
	if b.spec.ProbeSourceV4.IsValid() {
		out = append(out, b.spec.ProbeSourceV4)
	}
	if b.spec.IPv6 && b.spec.ProbeSourceV6.IsValid() {
		out = append(out, b.spec.ProbeSourceV6)
	}
	return out
}

// ipv6Bypass returns the rule that lets IPv6 through untouched when IPv6
// capture is off, or nothing.
func (b *builder) ipv6Bypass() []Rule {
	if b.spec.IPv6 {
		return nil
	}
	// nft: meta nfproto ipv6 accept
	return []Rule{NewRule(nfproto(unix.NFPROTO_IPV6, "ipv6"), accept())}
}

// inboundBypass is what inbound capture never touches, in both modes,
// after ipv6Bypass and the rerouted interfaces.
func (b *builder) inboundBypass() []Rule {
	s := b.spec
	var rules []Rule
	// Loopback traffic inside the pod, including the proxy talking to the
	// app, is never captured.
	// nft: iifname "lo" accept
	rules = append(rules, NewRule(ifaceIs(expr.MetaKeyIIFNAME, "iifname", "lo"), accept()))
	// Kubelet probes, SNATed on the node to the probe address.
	// nft: ip saddr 169.254.7.127 accept
	for _, a := range b.probeAddrs() {
		rules = append(rules, NewRule(addrMatch(netip.PrefixFrom(a, a.BitLen()), true), accept()))
	}
	// nft: tcp dport 22 accept
	for _, p := range s.ExcludeInboundPorts {
		rules = append(rules, NewRule(portMatch(unix.IPPROTO_TCP, "tcp", p, false), accept()))
	}
	return rules
}

func (b *builder) manglePrerouting() {
	s := b.spec
	rules := []Rule{
		// A packet from one of the proxy's sockets entering the pod stack
		// (the proxy talking to the app with the client's address as
		// source) marks its connection, so the app's replies can be
		// routed back to the proxy instead of out of the pod.
		// nft: meta mark & 0x00000fff == 0x00000539 ct mark set ct mark & 0xfffff000 | 0x00000111
		NewRule(markIs(s.ProxyMark, true), setCtMark(s.TProxyMark)),
	}
	if s.Mode == ModeTProxy && !s.NoInboundCapture {
		rules = append(rules, b.ipv6Bypass()...)
		// Rerouted interfaces' TCP is left to nat-prerouting, which
		// redirects it to the outbound port.
		// nft: iifname "k6t-eth0" meta l4proto tcp accept
		for _, name := range s.RerouteInterfaces {
			rules = append(rules, NewRule(ifaceIs(expr.MetaKeyIIFNAME, "iifname", name), L4Proto(unix.IPPROTO_TCP, "tcp"), accept()))
		}
		rules = append(rules, b.inboundBypass()...)
		rules = append(rules,
			// Packets of connections already delivered to a transparent
			// socket keep the tproxy mark so policy routing delivers them
			// locally; it must precede the established accept, or the
			// handshake's final ACK to a non-local address is routed away.
			// Only established ones: a new connection straight to one of
			// the proxy's own listeners (say :15001) must be captured like
			// any other, not let through to push traffic out of the pod.
			// nft: meta l4proto tcp ct state established socket transparent 1 meta mark set meta mark & 0xfffff000 | 0x00000111 accept
			NewRule(L4Proto(unix.IPPROTO_TCP, "tcp"), ctStateIs(expr.CtStateBitESTABLISHED, "established"), socketTransparent(), setMark(s.TProxyMark), accept()),
			// Connections that are not ours to capture (replies to the
			// proxy's upstream connections, the app's existing ones).
			// nft: ct state established,related accept
			NewRule(ctStateIs(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, "established,related"), accept()),
		)
		// Tunnel traffic goes to the proxy's HBONE listener, one rule per
		// family when there is a target address (tproxy takes the
		// address of one family; for the other it does not match).
		// nft: tcp dport 15008 meta mark & 0x00000fff != 0x00000539 tproxy ip to 127.0.0.1:15008 meta mark set ... accept
		for _, t := range b.tproxyTargets() {
			rules = append(rules, NewRule(portMatch(unix.IPPROTO_TCP, "tcp", s.InboundHBONEPort, false), markIs(s.ProxyMark, false),
				tproxyTo(t, s.InboundHBONEPort), setMark(s.TProxyMark), accept()))
		}
		// Everything else inbound goes to the plaintext listener.
		// nft: meta l4proto tcp meta mark & 0x00000fff != 0x00000539 tproxy ip to 127.0.0.1:15006 meta mark set ... accept
		for _, t := range b.tproxyTargets() {
			rules = append(rules, NewRule(L4Proto(unix.IPPROTO_TCP, "tcp"), markIs(s.ProxyMark, false),
				tproxyTo(t, s.InboundPort), setMark(s.TProxyMark), accept()))
		}
		rules = append(rules,
			// tproxy only matches when a transparent listener exists; with
			// the proxy down or restarting, new connections would otherwise
			// reach the app uncaptured. Dropping them fails closed: the
			// client retries, and gets the proxy once it listens again.
			// (REDIRECT mode fails closed by itself: the NATed SYN is
			// refused.)
			// nft: meta l4proto tcp drop
			NewRule(L4Proto(unix.IPPROTO_TCP, "tcp"), drop()),
		)
	}
	b.chain(manglePrerouting, rules...)
}

// tproxyTargets lists the tproxy rules' targets: one without family when
// neither family has an address (the kernel then uses the packet's own
// family), else one per captured family.
func (b *builder) tproxyTargets() []tproxyTarget {
	s := b.spec
	if !s.TProxyAddrV4.IsValid() && !s.TProxyAddrV6.IsValid() {
		return []tproxyTarget{{family: unix.NFPROTO_UNSPEC}}
	}
	out := []tproxyTarget{{family: unix.NFPROTO_IPV4, addr: s.TProxyAddrV4}}
	if s.IPv6 {
		out = append(out, tproxyTarget{family: unix.NFPROTO_IPV6, addr: s.TProxyAddrV6})
	}
	return out
}

func (b *builder) mangleOutput() {
	s := b.spec
	b.chain(mangleOutput,
		// The app's replies on connections the proxy opened into the pod
		// get the tproxy mark back from the connection, so the fwmark rule
		// sends them to the local table and thus to the proxy.
		// nft: ct mark & 0x00000fff == 0x00000111 meta mark set ct mark
		NewRule(ctMarkIs(s.TProxyMark), restoreMark()),
	)
}

func (b *builder) natPrerouting() {
	s := b.spec
	rules := b.ipv6Bypass()
	// TCP arriving on a rerouted interface is the outbound traffic of
	// what sits behind it (a VM, nested containers): to the outbound
	// port, first, before anything inbound capture would do with it, as
	// Istio's rules order it.
	// nft: iifname "k6t-eth0" meta l4proto tcp redirect to :15001
	for _, name := range s.RerouteInterfaces {
		rules = append(rules, NewRule(ifaceIs(expr.MetaKeyIIFNAME, "iifname", name), L4Proto(unix.IPPROTO_TCP, "tcp"), redirectTo(s.OutboundPort)))
	}
	if s.Mode == ModeTProxy || s.NoInboundCapture {
		// Inbound capture is mangle-prerouting's, or off.
		b.chain(natPrerouting, rules...)
		return
	}
	rules = append(rules, b.inboundBypass()...)
	rules = append(rules,
		// The proxy listens on the HBONE port itself; leave it alone.
		// nft: tcp dport 15008 accept
		NewRule(portMatch(unix.IPPROTO_TCP, "tcp", s.InboundHBONEPort, false), accept()),
		// nft: meta l4proto tcp meta mark & 0x00000fff != 0x00000539 redirect to :15006
		NewRule(L4Proto(unix.IPPROTO_TCP, "tcp"), markIs(s.ProxyMark, false), redirectTo(s.InboundPort)),
	)
	b.chain(natPrerouting, rules...)
}

func (b *builder) natOutput() {
	s := b.spec
	rules := []Rule{
		// The proxy's own sockets are never captured.
		// nft: meta mark & 0x00000fff == 0x00000539 accept
		NewRule(markIs(s.ProxyMark, true), accept()),
	}
	rules = append(rules, b.ipv6Bypass()...)
	// Replies to probes.
	// nft: ip daddr 169.254.7.127 accept
	for _, a := range b.probeAddrs() {
		rules = append(rules, NewRule(addrMatch(netip.PrefixFrom(a, a.BitLen()), false), accept()))
	}
	rules = append(rules,
		// Replies on connections the proxy opened into the pod.
		// nft: meta mark & 0x00000fff == 0x00000111 accept
		NewRule(markIs(s.TProxyMark, true), accept()),
		// The app talking to itself (127.0.0.1, ::1 or its own IP).
		// nft: oifname "lo" accept
		NewRule(ifaceIs(expr.MetaKeyOIFNAME, "oifname", "lo"), accept()),
	)
	if s.CaptureDNS {
		rules = append(rules,
			// nft: udp dport 53 redirect to :15053
			NewRule(portMatch(unix.IPPROTO_UDP, "udp", 53, false), redirectTo(s.DNSPort)),
			// nft: tcp dport 53 redirect to :15053
			NewRule(portMatch(unix.IPPROTO_TCP, "tcp", 53, false), redirectTo(s.DNSPort)),
		)
	}
	// nft: tcp dport 5432 accept
	for _, p := range s.ExcludeOutboundPorts {
		rules = append(rules, NewRule(portMatch(unix.IPPROTO_TCP, "tcp", p, false), accept()))
	}
	// nft: ip daddr 10.0.0.0/8 accept
	for _, c := range s.ExcludeOutboundCIDRs {
		rules = append(rules, NewRule(addrMatch(c, false), accept()))
	}
	// Everything else the pod sends over TCP goes to the proxy.
	// nft: meta l4proto tcp redirect to :15001
	rules = append(rules, NewRule(L4Proto(unix.IPPROTO_TCP, "tcp"), redirectTo(s.OutboundPort)))
	b.chain(natOutput, rules...)
}
