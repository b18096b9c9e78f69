package nftlive

import (
	"encoding/binary"
	"strings"
)

// tlv is one netlink attribute, its data a view into the message. Verify
// runs for every pod on every reconcile, so expressions are split and
// canonicalised here without the allocations of a general decoder.
type tlv struct {
	typ  uint16
	data []byte
}

// parseTLVs appends the attributes of b to dst; ok is false when b is not
// a well-formed attribute list.
func parseTLVs(b []byte, dst []tlv) (_ []tlv, ok bool) {
	for len(b) > 0 {
		if len(b) < 4 {
			return dst, false
		}
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return dst, false
		}
		dst = append(dst, tlv{typ: binary.NativeEndian.Uint16(b[2:4]), data: b[4:l]})
		b = b[min((l+3)&^3, len(b)):]
	}
	return dst, true
}

// appendTLV appends one attribute, padded to 4 bytes as netlink wants.
func appendTLV(out []byte, typ uint16, data []byte) []byte {
	out = binary.NativeEndian.AppendUint16(out, uint16(4+len(data)))
	out = binary.NativeEndian.AppendUint16(out, typ)
	out = append(out, data...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	return out
}

// sortTLVs sorts by type, keeping the order of equal types; lists are a
// handful long.
func sortTLVs(ts []tlv) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j].typ < ts[j-1].typ; j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// exprNames interns the names of expressions, so splitting a rule does
// not allocate one string per expression.
var exprNames = map[string]string{}

func init() {
	for _, n := range strings.Fields("bitwise byteorder cmp connlimit counter ct dup dynset exthdr fib flow_offload fwd hash immediate inner last limit log lookup masq match meta nat notrack numgen objref osf payload queue quota range redir reject rt socket synproxy target tproxy tunnel xfrm") {
		exprNames[n] = n
	}
}

func exprName(b []byte) string {
	if i := len(b) - 1; i >= 0 && b[i] == 0 {
		b = b[:i]
	}
	if n, ok := exprNames[string(b)]; ok {
		return n
	}
	return string(b)
}
