// Package probe owns nftredir's one table in the node's network namespace:
// kubelet health probes to enrolled pods are SNATed to a fixed probe
// source address, which the pod's capture rules let through, so a probe
// reaches the app itself and not the node proxy.
//
// The table is built as a pure value (Build) and programmed over netlink
// by a Manager, which sends only what changed, batching concurrent changes.
// Pod addresses live in two sets whose elements carry the owning pod's UID
// as their comment, so releasing a pod removes only what that pod added
// even after its address was reused.
package probe

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/nftlive"
)

// Names of what nftredir owns in the node namespace. Nothing else there is
// ever read-modify-written.
const (
	TableName = "nftredir-node"
	SetV4     = "pod-ips-v4"
	SetV6     = "pod-ips-v6"
	ChainName = "postrouting"
)

// srcnat is the priority of the chain: where NAT of locally originated
// packets happens, after routing has chosen the source address.
const srcnat = 100

// Spec is what the node table depends on.
type Spec struct {
	// KubeletUID is the uid whose sockets are probes. Matching the socket
	// owner, not the node address, keeps kube-proxy-forwarded traffic from
	// the node (same source address) captured.
	KubeletUID uint32
	// SourceV4 and SourceV6 are the probe source addresses. An invalid
	// (zero) address omits that family's rule; its set still exists, so
	// enrolment does not depend on which families are on.
	SourceV4, SourceV6 netip.Addr
}

// DefaultSpec is kubelet as root and the default probe sources, the
// addresses ztunnel-compatible pod rules let through uncaptured.
func DefaultSpec() Spec {
	return Spec{KubeletUID: 0, SourceV4: defaults.ProbeSourceV4(), SourceV6: defaults.ProbeSourceV6()}
}

// Validate rejects sources of the wrong family or that could never be a
// probe's source.
func (s Spec) Validate() error {
	var errs []error
	if !s.SourceV4.IsValid() && !s.SourceV6.IsValid() {
		errs = append(errs, errors.New("no probe source address: at least one of IPv4 and IPv6 is needed"))
	}
	if a := s.SourceV4; a.IsValid() && (!a.Is4() || a.IsUnspecified() || a.IsMulticast()) {
		errs = append(errs, fmt.Errorf("IPv4 probe source %s is not a usable IPv4 unicast address", a))
	}
	if a := s.SourceV6; a.IsValid() && (!a.Is6() || a.Is4In6() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast()) {
		errs = append(errs, fmt.Errorf("IPv6 probe source %s is not a usable IPv6 unicast address", a))
	}
	return errors.Join(errs...)
}

// Ruleset is the node table's skeleton: sets (without elements, which
// change with enrolment) and the one chain.
type Ruleset struct {
	Spec Spec
	// Digest identifies the table's content: a hash of the sets and the
	// chain with every rule's encoded expressions, so any change to what
	// the builder emits changes it. Every rule's comment carries it.
	Digest string
	Sets   []Set
	Chain  Chain
}

// Set is one of the address sets.
type Set struct {
	Name string
	Type nftables.SetDatatype
}

// Chain is the base chain and its rules.
type Chain struct {
	Name     string
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority int32
	Rules    []Rule
}

// Rule is one rule: the kernel expressions and the same rule as `nft list`
// prints it (without the comment).
type Rule struct {
	Exprs []expr.Any
	Text  string
	// canon is Exprs in the form compared with the kernel's (Build fills
	// it).
	canon []string
}

// Build returns the node table for s. It does no I/O.
func Build(s Spec) (*Ruleset, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("invalid probe spec: %w", err)
	}
	rs := &Ruleset{
		Spec: s,
		Sets: []Set{
			{Name: SetV4, Type: nftables.TypeIPAddr},
			{Name: SetV6, Type: nftables.TypeIP6Addr},
		},
		Chain: Chain{Name: ChainName, Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPostrouting, Priority: srcnat},
	}
	if s.SourceV4.IsValid() {
		// nft: meta l4proto tcp meta skuid 0 ip daddr @pod-ips-v4 counter snat ip to 169.254.7.127
		rs.Chain.Rules = append(rs.Chain.Rules, snatRule(s.KubeletUID, SetV4, s.SourceV4))
	}
	if s.SourceV6.IsValid() {
		// nft: meta l4proto tcp meta skuid 0 ip6 daddr @pod-ips-v6 counter snat ip6 to fd16:...
		rs.Chain.Rules = append(rs.Chain.Rules, snatRule(s.KubeletUID, SetV6, s.SourceV6))
	}
	if err := rs.encode(); err != nil {
		return nil, err
	}
	return rs, nil
}

// encode fills every rule's canonical form and derives the digest from
// what the kernel is sent: set names and types, the chain, every rule's
// encoded expressions. No version number to remember to bump.
func (rs *Ruleset) encode() error {
	d := nftlive.NewDigest()
	for _, st := range rs.Sets {
		d.Field(fmt.Appendf(nil, "set %s %s", st.Name, st.Type.Name))
	}
	c := &rs.Chain
	d.Field(fmt.Appendf(nil, "chain %s %s %d %d", c.Name, c.Type, *c.Hook, c.Priority))
	for i := range c.Rules {
		r := &c.Rules[i]
		wire, err := nftlive.Encode(nftables.TableFamilyINet, r.Exprs)
		if err != nil {
			return fmt.Errorf("encode probe rule %d: %w", i+1, err)
		}
		r.canon = nftlive.CanonicalAll(wire)
		d.Rule(wire)
	}
	rs.Digest = d.String()
	return nil
}

// Comment is what every rule of the chain carries.
func (rs *Ruleset) Comment() string {
	return "nftredir node probe digest=" + rs.Digest
}

// snatRule matches TCP from the kubelet's sockets to an enrolled pod
// address and rewrites the source. Only locally originated packets have a
// socket owner, so forwarded traffic never matches.
func snatRule(uid uint32, set string, source netip.Addr) Rule {
	nfproto, word, offset, natFamily := byte(unix.NFPROTO_IPV4), "ip", uint32(16), uint32(unix.NFPROTO_IPV4)
	if source.Is6() {
		nfproto, word, offset, natFamily = unix.NFPROTO_IPV6, "ip6", 24, unix.NFPROTO_IPV6
	}
	addr := source.AsSlice()
	return Rule{
		Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uid)},
			// The family guard is implied by "ip"/"ip6" in nft's text but
			// must be explicit in an inet table's bytecode.
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(addr))},
			&expr.Lookup{SourceRegister: 1, SetName: set},
			// Counts the probes SNATed: whether the kubelet's probes
			// reach this rule at all is the first question when they fail.
			&expr.Counter{},
			&expr.Immediate{Register: 1, Data: addr},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: natFamily, RegAddrMin: 1, RegAddrMax: 1},
		},
		Text: fmt.Sprintf("meta l4proto tcp meta skuid %d %s daddr @%s counter packets 0 bytes 0 snat %s to %s", uid, word, set, word, source),
	}
}

// String renders the table as `nft list table inet nftredir-node` prints
// it while its sets are empty.
func (rs *Ruleset) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "table inet %s {\n", TableName)
	for _, s := range rs.Sets {
		fmt.Fprintf(&sb, "\tset %s {\n\t\ttype %s\n\t}\n\n", s.Name, s.Type.Name)
	}
	c := rs.Chain
	fmt.Fprintf(&sb, "\tchain %s {\n", c.Name)
	fmt.Fprintf(&sb, "\t\ttype nat hook postrouting priority %s; policy accept;\n", priorityName(c.Priority))
	for _, r := range c.Rules {
		fmt.Fprintf(&sb, "\t\t%s comment %q\n", r.Text, rs.Comment())
	}
	sb.WriteString("\t}\n}\n")
	return sb.String()
}

func priorityName(p int32) string {
	if p == srcnat {
		return "srcnat"
	}
	return fmt.Sprint(p)
}

// setFor returns the set an address belongs in.
func setFor(a netip.Addr) string {
	if a.Is4() {
		return SetV4
	}
	return SetV6
}

// ParseAddrs turns pod IP strings (as AddPod receives them) into the
// addresses the sets hold. IPv4-mapped IPv6 addresses count as IPv4.
func ParseAddrs(ips []string) ([]netip.Addr, error) {
	out := make([]netip.Addr, 0, len(ips))
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("pod ip %q: %w", s, err)
		}
		if a.Zone() != "" {
			return nil, fmt.Errorf("pod ip %q: zoned addresses are not pod addresses", s)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}
