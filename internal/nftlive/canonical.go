package nftlive

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Attribute numbers the x/sys version in use does not name.
const (
	nftaBitwiseOp   = 6 // NFTA_BITWISE_OP
	nftaBitwiseData = 7 // NFTA_BITWISE_DATA
	nftaSocketKey   = 1 // NFTA_SOCKET_KEY
	nftaSocketLevel = 3 // NFTA_SOCKET_LEVEL
	nftSocketCgroup = 3 // NFT_SOCKET_CGROUPV2

	typeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
)

// nested lists, per expression, the attributes that hold nested data
// (struct nft_data: NFTA_DATA_VALUE or NFTA_DATA_VERDICT).
var nested = map[string][]uint16{
	"cmp":       {unix.NFTA_CMP_DATA},
	"immediate": {unix.NFTA_IMMEDIATE_DATA},
	"bitwise":   {unix.NFTA_BITWISE_MASK, unix.NFTA_BITWISE_XOR, nftaBitwiseData},
	"range":     {unix.NFTA_RANGE_FROM_DATA, unix.NFTA_RANGE_TO_DATA},
}

// Canonical returns e in a form in which the library's encoding of an
// expression and the kernel's report of the expression it installed are
// equal exactly when they are the same expression. It undoes only what the
// kernel itself changes between what it is sent and what it dumps:
//
//   - nests: the kernel dumps nested attributes without NLA_F_NESTED
//     (nla_nest_start_noflag), the library sets it; the flag bits are
//     dropped from every attribute type;
//   - order: each expression's dump function emits its attributes in its
//     own order, which need not be the order they were sent in; netlink
//     attributes are keyed by type, so they are sorted by type;
//   - bitwise: without NFTA_BITWISE_OP the kernel takes the boolean
//     (mask and xor) operation and dumps it; an absent op is that op;
//   - redir: without NFTA_REDIR_REG_PROTO_MAX the kernel takes the
//     minimum's register as the maximum and dumps both;
//   - socket: NFTA_SOCKET_LEVEL only means something for the cgroupv2
//     key and is dumped only for it; the library always sends it;
//   - lookup: NFTA_LOOKUP_SET_ID is a batch-local reference to a set
//     created in the same batch, which the kernel resolves to the named
//     set and never dumps (the library always sends it); an absent
//     NFTA_LOOKUP_FLAGS is 0, which the kernel dumps;
//   - nat: with an address register the kernel sets NF_NAT_RANGE_MAP_IPS
//     in the flags it dumps;
//   - counter: the kernel dumps what it counted, we send zeros; only the
//     counter's presence is compared (its values, and the padding the
//     kernel may add before them, are dropped), so traffic is never
//     drift but a rule that lost its counter is.
//
// Everything else (every register, key, offset, length, value, verdict
// and the expression's name) must be byte-identical. Data that does not
// parse as attributes is compared as it is.
func Canonical(e Expr) string { return string(AppendCanonical(nil, e)) }

// AppendCanonical appends Canonical(e) to out, for comparing without an
// allocation per expression.
func AppendCanonical(out []byte, e Expr) []byte {
	var buf [12]tlv
	out = append(append(out, e.Name...), 0)
	attrs, ok := parseTLVs(e.Data, buf[:0])
	if !ok {
		return append(append(out, '!'), e.Data...)
	}
	for i := range attrs {
		attrs[i].typ &= typeMask
		if slices.Contains(nested[e.Name], attrs[i].typ) {
			attrs[i].data = canonicalData(attrs[i].data, nil)
		}
	}
	attrs = kernelDefaults(e.Name, attrs)
	sortTLVs(attrs)
	for _, a := range attrs {
		out = appendTLV(out, a.typ, a.data)
	}
	return out
}

// canonicalData canonicalises a struct nft_data (a value, or a verdict:
// code and, for jumps, chain, nested once more) into out.
func canonicalData(b, out []byte) []byte {
	var buf [4]tlv
	attrs, ok := parseTLVs(b, buf[:0])
	if !ok {
		return b
	}
	for i := range attrs {
		attrs[i].typ &= typeMask
		if attrs[i].typ == unix.NFTA_DATA_VERDICT {
			attrs[i].data = canonicalData(attrs[i].data, nil)
		}
	}
	sortTLVs(attrs)
	for _, a := range attrs {
		out = appendTLV(out, a.typ, a.data)
	}
	return out
}

func find(attrs []tlv, typ uint16) int {
	return slices.IndexFunc(attrs, func(a tlv) bool { return a.typ == typ })
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// kernelDefaults brings attrs to the form the kernel dumps (see Canonical).
func kernelDefaults(name string, attrs []tlv) []tlv {
	switch name {
	case "bitwise":
		if find(attrs, nftaBitwiseOp) < 0 {
			attrs = append(attrs, tlv{nftaBitwiseOp, be32(unix.NFT_BITWISE_BOOL)})
		}
	case "redir":
		if i := find(attrs, unix.NFTA_REDIR_REG_PROTO_MIN); i >= 0 && find(attrs, unix.NFTA_REDIR_REG_PROTO_MAX) < 0 {
			attrs = append(attrs, tlv{unix.NFTA_REDIR_REG_PROTO_MAX, attrs[i].data})
		}
	case "lookup":
		if i := find(attrs, unix.NFTA_LOOKUP_SET_ID); i >= 0 {
			attrs = slices.Delete(attrs, i, i+1)
		}
		if find(attrs, unix.NFTA_LOOKUP_FLAGS) < 0 {
			attrs = append(attrs, tlv{unix.NFTA_LOOKUP_FLAGS, be32(0)})
		}
	case "nat":
		if find(attrs, unix.NFTA_NAT_REG_ADDR_MIN) >= 0 {
			var flags uint32
			i := find(attrs, unix.NFTA_NAT_FLAGS)
			if i >= 0 && len(attrs[i].data) == 4 {
				flags = binary.BigEndian.Uint32(attrs[i].data)
			}
			if i >= 0 {
				attrs[i].data = be32(flags | unix.NF_NAT_RANGE_MAP_IPS)
			} else {
				attrs = append(attrs, tlv{unix.NFTA_NAT_FLAGS, be32(unix.NF_NAT_RANGE_MAP_IPS)})
			}
		}
	case "counter":
		attrs = attrs[:0]
	case "socket":
		if k := find(attrs, nftaSocketKey); k >= 0 && !slices.Equal(attrs[k].data, be32(nftSocketCgroup)) {
			if i := find(attrs, nftaSocketLevel); i >= 0 {
				attrs = slices.Delete(attrs, i, i+1)
			}
		}
	}
	return attrs
}

// CanonicalAll is Canonical of every expression of a rule.
func CanonicalAll(es []Expr) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = Canonical(e)
	}
	return out
}

// Raw renders an expression nobody recognised, so a listing shows that it
// is there and what it holds: its name and its attributes (type=hex).
func Raw(e Expr) string {
	var sb strings.Builder
	sb.WriteString("[expr ")
	sb.WriteString(e.Name)
	attrs, ok := parseTLVs(e.Data, nil)
	if !ok {
		sb.WriteString(" " + hex.EncodeToString(e.Data) + "]")
		return sb.String()
	}
	for _, a := range attrs {
		fmt.Fprintf(&sb, " %d=%x", a.typ&typeMask, a.data)
	}
	sb.WriteString("]")
	return sb.String()
}

// CounterValues returns the packets and bytes a counter expression holds;
// ok is false for any other expression or a malformed one.
func CounterValues(e Expr) (packets, bytes uint64, ok bool) {
	if e.Name != "counter" {
		return 0, 0, false
	}
	var buf [3]tlv
	attrs, parsed := parseTLVs(e.Data, buf[:0])
	if !parsed {
		return 0, 0, false
	}
	for _, a := range attrs {
		if len(a.data) != 8 {
			continue
		}
		switch a.typ & typeMask {
		case unix.NFTA_COUNTER_PACKETS:
			packets, ok = binary.BigEndian.Uint64(a.data), true
		case unix.NFTA_COUNTER_BYTES:
			bytes, ok = binary.BigEndian.Uint64(a.data), true
		}
	}
	return packets, bytes, ok
}
