package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// baseChain is one row of the static skeleton. Every chain is a base chain:
// the rules are few, and without jumps a listing reads top to bottom.
type baseChain struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority int32
}

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

	rs := &Ruleset{Spec: s, Chains: b.chains}
	if err := rs.encode(); err != nil {
		return nil, fmt.Errorf("build for pod %q: %w", s.PodID, err)
	}
	return rs, nil
}

// encode fills every rule's wire form and canonical form, and derives the
// digest from them: the hash covers exactly what the kernel is sent (pod
// id, chains, every expression's bytes), so a builder change that changes
// any rule changes the digest and is seen as drift, with no version
// number to remember to bump. The pod id is part of it, so one pod's table
// never verifies as another's.
func (rs *Ruleset) encode() error {
	d := nftlive.NewDigest()
	d.Field([]byte(rs.Spec.PodID))
	for ci := range rs.Chains {
		ch := &rs.Chains[ci]
		d.Field(fmt.Appendf(nil, "chain %s %s %d %d", ch.Name, ch.Type, *ch.Hook, ch.Priority))
		for ri := range ch.Rules {
			r := &ch.Rules[ri]
			wire, err := nftlive.Encode(nftables.TableFamilyINet, r.Exprs)
			if err != nil {
				return fmt.Errorf("chain %s rule %d: %w", ch.Name, ri+1, err)
			}
			r.wire, r.canon = wire, nftlive.CanonicalAll(wire)
			d.Rule(wire)
		}
	}
	rs.Digest = d.String()
	return nil
}

// WithoutCounters is rs with every rule's counter left out (and its own
// digest): what the table was before rules counted, for measuring what
// the counters cost (make bench). The daemon never programs it.
func (rs *Ruleset) WithoutCounters() (*Ruleset, error) {
	out := &Ruleset{Spec: rs.Spec, Chains: make([]Chain, len(rs.Chains))}
	for i, c := range rs.Chains {
		c.Rules = make([]Rule, 0, len(c.Rules))
		for _, r := range rs.Chains[i].Rules {
			c.Rules = append(c.Rules, assemble(slices.DeleteFunc(slices.Clone(r.parts), isCounter)))
		}
		out.Chains[i] = c
	}
	if err := out.encode(); err != nil {
		return nil, err
	}
	return out, nil
}

// Bytecode renders every rule's expressions as they are sent to the
// kernel, one line per expression (its name and NFTA_EXPR_DATA in hex),
// under the rule's nft text: the pure tier's view of the bytecode, which
// the text alone does not pin down (an offset or a register can change
// while the text stays the same).
func (rs *Ruleset) Bytecode() string {
	var sb strings.Builder
	for _, c := range rs.Chains {
		fmt.Fprintf(&sb, "chain %s\n", c.Name)
		for i, r := range c.Rules {
			fmt.Fprintf(&sb, "\trule %d: %s\n", i+1, r.Text)
			for _, e := range r.wire {
				fmt.Fprintf(&sb, "\t\t%-9s %x\n", e.Name, e.Data)
			}
		}
	}
	return sb.String()
}

// Comment is the comment every rule of rs carries: whose table it is and
// which spec built it.
func (rs *Ruleset) Comment() string {
	return fmt.Sprintf("nftredir pod=%s digest=%s", rs.Spec.PodID, rs.Digest)
}

type builder struct {
	spec   Spec
	chains []Chain
}

func (b *builder) chain(c baseChain, rules ...Rule) {
	b.chains = append(b.chains, Chain{Name: c.name, Type: c.typ, Hook: c.hook, Priority: c.priority, Rules: rules})
}

func (b *builder) rawPrerouting() {
	s := b.spec
	b.chain(rawPrerouting,
		// Upstream DNS replies to the proxy join the proxy's zone.
		// nft: meta mark & 0x00000fff != 0x00000539 udp sport 53 ct zone set 1
		rule(markIs(s.ProxyMark, false), portMatch(unix.IPPROTO_UDP, "udp", 53, true), setCtZone(1)),
	)
}

func (b *builder) rawOutput() {
	s := b.spec
	b.chain(rawOutput,
		// The proxy's own DNS queries go to zone 1.
		// nft: meta mark & 0x00000fff == 0x00000539 udp dport 53 ct zone set 1
		rule(markIs(s.ProxyMark, true), portMatch(unix.IPPROTO_UDP, "udp", 53, false), setCtZone(1)),
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
	return []Rule{rule(nfproto(unix.NFPROTO_IPV6, "ipv6"), accept())}
}

// inboundBypass is what inbound capture never touches, in both modes,
// after ipv6Bypass and the rerouted interfaces.
func (b *builder) inboundBypass() []Rule {
	s := b.spec
	var rules []Rule
	// Loopback traffic inside the pod, including the proxy talking to the
	// app, is never captured.
	// nft: iifname "lo" accept
	rules = append(rules, rule(ifaceIs(expr.MetaKeyIIFNAME, "iifname", "lo"), accept()))
	// Kubelet probes, SNATed on the node to the probe address.
	// nft: ip saddr 169.254.7.127 accept
	for _, a := range b.probeAddrs() {
		rules = append(rules, rule(addrMatch(netip.PrefixFrom(a, a.BitLen()), true), accept()))
	}
	// nft: tcp dport 22 accept
	for _, p := range s.ExcludeInboundPorts {
		rules = append(rules, rule(portMatch(unix.IPPROTO_TCP, "tcp", p, false), accept()))
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
		rule(markIs(s.ProxyMark, true), setCtMark(s.TProxyMark)),
	}
	if s.Mode == ModeTProxy && !s.NoInboundCapture {
		rules = append(rules, b.ipv6Bypass()...)
		// Rerouted interfaces' TCP is left to nat-prerouting, which
		// redirects it to the outbound port.
		// nft: iifname "k6t-eth0" meta l4proto tcp accept
		for _, name := range s.RerouteInterfaces {
			rules = append(rules, rule(ifaceIs(expr.MetaKeyIIFNAME, "iifname", name), l4proto(unix.IPPROTO_TCP, "tcp"), accept()))
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
			rule(l4proto(unix.IPPROTO_TCP, "tcp"), ctStateIs(expr.CtStateBitESTABLISHED, "established"), socketTransparent(), setMark(s.TProxyMark), accept()),
			// Connections that are not ours to capture (replies to the
			// proxy's upstream connections, the app's existing ones).
			// nft: ct state established,related accept
			rule(ctStateIs(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, "established,related"), accept()),
		)
		// Tunnel traffic goes to the proxy's HBONE listener, one rule per
		// family when there is a target address (tproxy takes the
		// address of one family; for the other it does not match).
		// nft: tcp dport 15008 meta mark & 0x00000fff != 0x00000539 tproxy ip to 127.0.0.1:15008 meta mark set ... accept
		for _, t := range b.tproxyTargets() {
			rules = append(rules, rule(portMatch(unix.IPPROTO_TCP, "tcp", s.InboundHBONEPort, false), markIs(s.ProxyMark, false),
				tproxyTo(t, s.InboundHBONEPort), setMark(s.TProxyMark), accept()))
		}
		// Everything else inbound goes to the plaintext listener.
		// nft: meta l4proto tcp meta mark & 0x00000fff != 0x00000539 tproxy ip to 127.0.0.1:15006 meta mark set ... accept
		for _, t := range b.tproxyTargets() {
			rules = append(rules, rule(l4proto(unix.IPPROTO_TCP, "tcp"), markIs(s.ProxyMark, false),
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
			rule(l4proto(unix.IPPROTO_TCP, "tcp"), drop()),
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
		rule(ctMarkIs(s.TProxyMark), restoreMark()),
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
		rules = append(rules, rule(ifaceIs(expr.MetaKeyIIFNAME, "iifname", name), l4proto(unix.IPPROTO_TCP, "tcp"), redirectTo(s.OutboundPort)))
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
		rule(portMatch(unix.IPPROTO_TCP, "tcp", s.InboundHBONEPort, false), accept()),
		// nft: meta l4proto tcp meta mark & 0x00000fff != 0x00000539 redirect to :15006
		rule(l4proto(unix.IPPROTO_TCP, "tcp"), markIs(s.ProxyMark, false), redirectTo(s.InboundPort)),
	)
	b.chain(natPrerouting, rules...)
}

func (b *builder) natOutput() {
	s := b.spec
	rules := []Rule{
		// The proxy's own sockets are never captured.
		// nft: meta mark & 0x00000fff == 0x00000539 accept
		rule(markIs(s.ProxyMark, true), accept()),
	}
	rules = append(rules, b.ipv6Bypass()...)
	// Replies to probes.
	// nft: ip daddr 169.254.7.127 accept
	for _, a := range b.probeAddrs() {
		rules = append(rules, rule(addrMatch(netip.PrefixFrom(a, a.BitLen()), false), accept()))
	}
	rules = append(rules,
		// Replies on connections the proxy opened into the pod.
		// nft: meta mark & 0x00000fff == 0x00000111 accept
		rule(markIs(s.TProxyMark, true), accept()),
		// The app talking to itself (127.0.0.1, ::1 or its own IP).
		// nft: oifname "lo" accept
		rule(ifaceIs(expr.MetaKeyOIFNAME, "oifname", "lo"), accept()),
	)
	if s.CaptureDNS {
		rules = append(rules,
			// nft: udp dport 53 redirect to :15053
			rule(portMatch(unix.IPPROTO_UDP, "udp", 53, false), redirectTo(s.DNSPort)),
			// nft: tcp dport 53 redirect to :15053
			rule(portMatch(unix.IPPROTO_TCP, "tcp", 53, false), redirectTo(s.DNSPort)),
		)
	}
	// nft: tcp dport 5432 accept
	for _, p := range s.ExcludeOutboundPorts {
		rules = append(rules, rule(portMatch(unix.IPPROTO_TCP, "tcp", p, false), accept()))
	}
	// nft: ip daddr 10.0.0.0/8 accept
	for _, c := range s.ExcludeOutboundCIDRs {
		rules = append(rules, rule(addrMatch(c, false), accept()))
	}
	// Everything else the pod sends over TCP goes to the proxy.
	// nft: meta l4proto tcp redirect to :15001
	rules = append(rules, rule(l4proto(unix.IPPROTO_TCP, "tcp"), redirectTo(s.OutboundPort)))
	b.chain(natOutput, rules...)
}

// String renders the ruleset the way `nft list table inet nftredir` prints
// it, comments included.
func (rs *Ruleset) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "table inet %s {\n", TableName)
	for i, c := range rs.Chains {
		if i > 0 {
			sb.WriteString("\n")
		}
		fmt.Fprintf(&sb, "\tchain %s {\n", c.Name)
		fmt.Fprintf(&sb, "\t\ttype %s hook %s priority %s; policy accept;\n", c.Type, hookName(c.Hook), priorityName(c))
		for _, r := range c.Rules {
			fmt.Fprintf(&sb, "\t\t%s comment %q\n", r.Text, rs.Comment())
		}
		sb.WriteString("\t}\n")
	}
	sb.WriteString("}\n")
	return sb.String()
}

func hookName(h *nftables.ChainHook) string {
	switch *h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	case *nftables.ChainHookForward:
		return "forward"
	}
	return fmt.Sprintf("hook(%d)", *h)
}

// priorityName prints priorities the way nft does for the inet family:
// within 10 of a standard priority its name and the offset ("mangle +
// 10", "dstnat - 10"), when the name is valid for the hook (dstnat only on
// prerouting, srcnat only on postrouting); otherwise the number.
func priorityName(c Chain) string {
	const reach = 10
	std := []struct {
		val  int32
		name string
		hook *nftables.ChainHook
	}{
		{-300, "raw", nil}, {-150, "mangle", nil}, {-100, "dstnat", nftables.ChainHookPrerouting},
		{0, "filter", nil}, {50, "security", nil}, {100, "srcnat", nftables.ChainHookPostrouting},
	}
	for _, p := range std {
		off := c.Priority - p.val
		if off < -reach || off > reach {
			continue
		}
		if p.hook != nil && *p.hook != *c.Hook {
			break // as nft: the nearest standard name does not apply
		}
		switch {
		case off > 0:
			return fmt.Sprintf("%s + %d", p.name, off)
		case off < 0:
			return fmt.Sprintf("%s - %d", p.name, -off)
		}
		return p.name
	}
	return fmt.Sprint(c.Priority)
}
