// Package probe owns nftredir's one table in the node's network namespace:
// kubelet health probes to enrolled pods are SNATed to a fixed probe
// source address, which the pod's capture rules let through, so a probe
// reaches the app itself and not the node proxy.
//
// The table is built as a pure value (Build), an nft.Table like the pod
// table, and programmed over netlink by a Manager through the same engine
// (nft.Plan, nft.ReadLive), sending only what changed and batching
// concurrent changes.
// Pod addresses live in two sets whose elements carry the owning pod's UID
// as their comment, so releasing a pod removes only what that pod added
// even after its address was reused.
package probe

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/nft"
)

// Names of what nftredir owns in the node namespace. Nothing else there is
// ever read-modify-written.
const (
	TableName = "nftredir-node"
	SetV4     = "pod-ips-v4"
	SetV6     = "pod-ips-v6"
	ChainName = "postrouting"
)

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
	nft.Table
}

// The chain SNATs where NAT of locally originated packets happens, after
// routing has chosen the source address.
var postrouting = nft.Chain{Name: ChainName, Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPostrouting, Priority: nft.PrioritySrcNAT}

// Build returns the node table for s. It does no I/O.
func Build(s Spec) (*Ruleset, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("invalid probe spec: %w", err)
	}
	chain := postrouting
	if s.SourceV4.IsValid() {
		// nft: meta l4proto tcp meta skuid 0 ip daddr @pod-ips-v4 counter snat ip to 169.254.7.127
		chain.Rules = append(chain.Rules, snatRule(s.KubeletUID, SetV4, s.SourceV4))
	}
	if s.SourceV6.IsValid() {
		// nft: meta l4proto tcp meta skuid 0 ip6 daddr @pod-ips-v6 counter snat ip6 to fd16:...
		chain.Rules = append(chain.Rules, snatRule(s.KubeletUID, SetV6, s.SourceV6))
	}
	rs := &Ruleset{Spec: s, Table: nft.Table{
		Name: TableName, Family: nftables.TableFamilyINet, Label: "nftredir node probe",
		Sets: []nft.Set{
			{Name: SetV4, Type: nftables.TypeIPAddr},
			{Name: SetV6, Type: nftables.TypeIP6Addr},
		},
		Chains: []nft.Chain{chain},
	}}
	if err := rs.Encode(); err != nil {
		return nil, fmt.Errorf("build probe table: %w", err)
	}
	return rs, nil
}

// snatRule matches TCP from the kubelet's sockets to an enrolled pod
// address and rewrites the source. Its counter (NewRule puts it before
// the snat) counts the probes SNATed: whether the kubelet's probes reach
// this rule at all is the first question when they fail.
func snatRule(uid uint32, set string, source netip.Addr) nft.Rule {
	return nft.NewRule(nft.L4Proto(unix.IPPROTO_TCP, "tcp"), nft.SkUID(uid), nft.DaddrInSet(source.Is6(), set), nft.SNAT(source))
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
