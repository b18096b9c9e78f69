package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
)

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
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		},
		text: "meta l4proto " + name,
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
	return Word{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		},
		text: "meta nfproto " + name,
	}
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
