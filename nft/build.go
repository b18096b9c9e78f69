package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
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

// A Word is one nft word of a rule: the kernel expressions and the text
// nft prints for them. Every rule of both tables is assembled from these
// (NewRule), so the text and the bytecode cannot disagree about what a
// rule contains, and a drifted rule is read back in the same words.
type Word struct {
	exprs []expr.Any
	text  string
}

// NewRule assembles a rule from its words, with a counter between the
// matches and the first statement, so every rule counts the packets and
// bytes it acted on (what support asks first: does traffic hit the
// rule?). This is the one place counters are added.
func NewRule(words ...Word) Rule {
	at := slices.IndexFunc(words, acts)
	if at < 0 {
		at = len(words)
	}
	return assemble(slices.Concat(words[:at:at], []Word{counter()}, words[at:]))
}

func assemble(parts []Word) Rule {
	r := Rule{parts: parts}
	for i, p := range parts {
		r.Exprs = append(r.Exprs, p.exprs...)
		if i > 0 {
			r.Text += " "
		}
		r.Text += p.text
	}
	return r
}

// acts reports whether a word is a statement (it sets, rewrites or
// decides) rather than a match: a counter placed after it would count
// packets that took another path, or none at all after a verdict.
func acts(p Word) bool {
	for _, e := range p.exprs {
		switch e := e.(type) {
		case *expr.Verdict, *expr.TProxy, *expr.Redir, *expr.NAT, *expr.Masq, *expr.Counter:
			return true
		case *expr.Meta:
			if e.SourceRegister {
				return true
			}
		case *expr.Ct:
			if e.SourceRegister {
				return true
			}
		}
	}
	return false
}

func isCounter(p Word) bool {
	if len(p.exprs) != 1 {
		return false
	}
	_, ok := p.exprs[0].(*expr.Counter)
	return ok
}

// nft: counter packets 0 bytes 0
// The text is what nft prints for a fresh table; live listings show the
// kernel's values instead (see countedText).
func counter() Word {
	return Word{exprs: []expr.Any{&expr.Counter{}}, text: counterText(0, 0)}
}

func counterText(packets, bytes uint64) string {
	return fmt.Sprintf("counter packets %d bytes %d", packets, bytes)
}

// countedText is r's text with the counter's values taken from the live
// rule's expressions (the first counter there), as `nft list` shows them.
func (r *Rule) countedText(live []nftlive.Expr) string {
	packets, bytes, ok := uint64(0), uint64(0), false
	for _, e := range live {
		if packets, bytes, ok = nftlive.CounterValues(e); ok {
			break
		}
	}
	if !ok {
		return r.Text
	}
	words := make([]string, len(r.parts))
	for i, p := range r.parts {
		words[i] = p.text
		if isCounter(p) {
			words[i] = counterText(packets, bytes)
		}
	}
	return strings.Join(words, " ")
}

func hex32(v uint32) string { return fmt.Sprintf("0x%08x", v) }

func ne32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

func be16(v uint16) []byte { return binaryutil.BigEndian.PutUint16(v) }

// ifname pads an interface name the way the kernel compares it.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// nft: meta l4proto tcp
func L4Proto(proto byte, name string) Word {
	return metaByteIs(expr.MetaKeyL4PROTO, "l4proto", proto, name)
}

// metaByteIs matches a one-byte meta key (a protocol number) against v,
// printed as name.
func metaByteIs(key expr.MetaKey, word string, v byte, name string) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{v}},
		},
		text: "meta " + word + " " + name,
	}
}

// nft: meta skuid 0
// Only locally originated packets have a socket owner, so forwarded
// traffic never matches.
func SkUID(uid uint32) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ne32(uid)},
		},
		text: fmt.Sprintf("meta skuid %d", uid),
	}
}

// nft: ip daddr @pod-ips-v4 / ip6 daddr @pod-ips-v6
// As in addrMatch, the family guard nft derives from "ip"/"ip6" is
// explicit in an inet table's bytecode.
func DaddrInSet(ipv6 bool, set string) Word {
	var proto byte = unix.NFPROTO_IPV4
	word, offset, size := "ip", uint32(16), uint32(4)
	if ipv6 {
		proto, word, offset, size = unix.NFPROTO_IPV6, "ip6", 24, 16
	}
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
			&expr.Lookup{SourceRegister: 1, SetName: set},
		},
		text: fmt.Sprintf("%s daddr @%s", word, set),
	}
}

// nft: snat ip to 169.254.7.127 / snat ip6 to fd16::1
func SNAT(to netip.Addr) Word {
	family, word := uint32(unix.NFPROTO_IPV4), "ip"
	if to.Is6() {
		family, word = unix.NFPROTO_IPV6, "ip6"
	}
	return Word{
		exprs: []expr.Any{
			&expr.Immediate{Register: 1, Data: to.AsSlice()},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: family, RegAddrMin: 1, RegAddrMax: 1},
		},
		text: fmt.Sprintf("snat %s to %s", word, to),
	}
}

// nft: meta nfproto ipv6
func nfproto(proto byte, name string) Word {
	return metaByteIs(expr.MetaKeyNFPROTO, "nfproto", proto, name)
}

// nft: iifname "lo" / oifname "lo"
func ifaceIs(key expr.MetaKey, word, name string) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
		},
		text: fmt.Sprintf("%s %q", word, name),
	}
}

// nft: meta mark & 0x00000fff == 0x00000539 (or !=)
func markIs(m Mark, equal bool) Word {
	op, sym := expr.CmpOpEq, "=="
	if !equal {
		op, sym = expr.CmpOpNeq, "!="
	}
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(m.Mask), Xor: ne32(0)},
			&expr.Cmp{Op: op, Register: 1, Data: ne32(m.Value)},
		},
		text: fmt.Sprintf("meta mark & %s %s %s", hex32(m.Mask), sym, hex32(m.Value)),
	}
}

// maskedSetText is the AND operand as nft 1.0.6 prints it: it shows the
// bytecode's mask with the value's bits folded in (0xfffff111 for a
// 0xfffff000 mask and 0x111 value). The kernel computes the same result
// either way; matching the listing lets tests diff it against String().
func maskedSetText(m Mark) string { return hex32(^m.Mask | m.Value) }

// nft: meta mark set meta mark & 0xfffff000 | 0x00000111
// Only the masked bits change, so marks other software keeps survive.
func setMark(m Mark) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(^m.Mask), Xor: ne32(m.Value)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		},
		text: fmt.Sprintf("meta mark set meta mark & %s | %s", maskedSetText(m), hex32(m.Value)),
	}
}

// nft: ct mark set ct mark & 0xfffff000 | 0x00000111
func setCtMark(m Mark) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(^m.Mask), Xor: ne32(m.Value)},
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
		},
		text: fmt.Sprintf("ct mark set ct mark & %s | %s", maskedSetText(m), hex32(m.Value)),
	}
}

// nft: ct mark & 0x00000fff == 0x00000111
func ctMarkIs(m Mark) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(m.Mask), Xor: ne32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ne32(m.Value)},
		},
		text: fmt.Sprintf("ct mark & %s == %s", hex32(m.Mask), hex32(m.Value)),
	}
}

// nft: meta mark set ct mark
func restoreMark() Word {
	return Word{
		exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		},
		text: "meta mark set ct mark",
	}
}

// nft: ct state established,related
func ctStateIs(bits uint32, names string) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(bits), Xor: ne32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ne32(0)},
		},
		text: "ct state " + names,
	}
}

// nft: socket transparent 1
func socketTransparent() Word {
	return Word{
		exprs: []expr.Any{
			&expr.Socket{Key: expr.SocketKeyTransparent, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}},
		},
		text: "socket transparent 1",
	}
}

// addrMatch matches the source or destination address against a prefix.
// The nfproto guard is implicit in nft's text (it derives it from "ip" or
// "ip6") but must be explicit in an inet table's bytecode.
//
// nft: ip saddr 169.254.7.127 / ip6 daddr fd00::/8
func addrMatch(p netip.Prefix, source bool) Word {
	var proto byte = unix.NFPROTO_IPV4
	word := "ip"
	offset := uint32(16) // IPv4 destination
	if source {
		offset = 12
	}
	if p.Addr().Is6() {
		proto, word, offset = unix.NFPROTO_IPV6, "ip6", 24
		if source {
			offset = 8
		}
	}
	field := "daddr"
	if source {
		field = "saddr"
	}
	addr := p.Addr().AsSlice()
	exprs := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(addr))},
	}
	text := fmt.Sprintf("%s %s %s", word, field, p.Addr())
	if p.Bits() < p.Addr().BitLen() {
		mask := netipMask(p)
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))})
		text = fmt.Sprintf("%s %s %s", word, field, p)
	}
	exprs = append(exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr})
	return Word{exprs: exprs, text: text}
}

func netipMask(p netip.Prefix) []byte {
	n := p.Addr().BitLen() / 8
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return mask
}

// portMatch matches a TCP or UDP source or destination port; the l4proto
// guard is implied by "tcp"/"udp" in nft's text.
//
// nft: tcp dport 15008
func portMatch(proto byte, name string, port uint16, source bool) Word {
	offset, field := uint32(2), "dport"
	if source {
		offset, field = 0, "sport"
	}
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(port)},
		},
		text: fmt.Sprintf("%s %s %d", name, field, port),
	}
}

// tproxyTarget is where a tproxy rule looks the transparent listener up:
// a family (unspecified: the packet's own, in an inet table) and an
// address of that family, or none (the kernel's choice, see Spec).
type tproxyTarget struct {
	family byte
	addr   netip.Addr
}

// tproxyTo hands the packet to a transparent listener on port at t.
//
// nft: tproxy to :15006 / tproxy ip to 127.0.0.1:15006 / tproxy ip6 to [::1]:15006
func tproxyTo(t tproxyTarget, port uint16) Word {
	word := map[byte]string{unix.NFPROTO_UNSPEC: "tproxy", unix.NFPROTO_IPV4: "tproxy ip", unix.NFPROTO_IPV6: "tproxy ip6"}[t.family]
	if !t.addr.IsValid() {
		return Word{
			exprs: []expr.Any{
				&expr.Immediate{Register: 1, Data: be16(port)},
				&expr.TProxy{Family: t.family, TableFamily: unix.NFPROTO_INET, RegPort: 1},
			},
			text: fmt.Sprintf("%s to :%d", word, port),
		}
	}
	return Word{
		exprs: []expr.Any{
			&expr.Immediate{Register: 1, Data: t.addr.AsSlice()},
			&expr.Immediate{Register: 2, Data: be16(port)},
			&expr.TProxy{Family: t.family, TableFamily: unix.NFPROTO_INET, RegAddr: 1, RegPort: 2},
		},
		text: fmt.Sprintf("%s to %s", word, netip.AddrPortFrom(t.addr, port)),
	}
}

// nft: redirect to :15001
func redirectTo(port uint16) Word {
	return Word{
		exprs: []expr.Any{
			&expr.Immediate{Register: 1, Data: be16(port)},
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
		},
		text: fmt.Sprintf("redirect to :%d", port),
	}
}

// nft: ct zone set 1
func setCtZone(zone uint16) Word {
	z := make([]byte, 2)
	binary.NativeEndian.PutUint16(z, zone)
	return Word{
		exprs: []expr.Any{
			&expr.Immediate{Register: 1, Data: z},
			&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true},
		},
		text: fmt.Sprintf("ct zone set %d", zone),
	}
}

// nft: accept
func accept() Word {
	return Word{exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}, text: "accept"}
}

// nft: drop
func drop() Word {
	return Word{exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}, text: "drop"}
}
