package state

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"time"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Version is the version of the pod records this daemon writes; it
// refuses records of a newer version instead of misreading them.
const Version = 1

// Record is the durable intent for one pod: everything needed to rebuild
// its ruleset and routing after a restart, without the caller.
//
// The spec is stored in full, not as a diff from daemon defaults, so that a
// restart with other defaults keeps enrolled pods as they were acknowledged
// until they are added again.
type Record struct {
	Kind           Kind       `json:"kind,omitempty"`
	Version        int        `json:"version"`
	PodUID         string     `json:"podUid"`
	PodName        string     `json:"podName,omitempty"`
	PodNamespace   string     `json:"podNamespace,omitempty"`
	NetnsPath      string     `json:"netnsPath"`
	NetnsID        string     `json:"netnsId"`
	PodIPs         []string   `json:"podIps,omitempty"`
	ServiceAccount *string    `json:"serviceAccount,omitempty"`
	Spec           SpecRecord `json:"spec"`
	Routing        Routing    `json:"routing"`
	EnrolledAt     time.Time  `json:"enrolledAt"`
	UpdatedAt      time.Time  `json:"updatedAt"`
	// Leaving is the namespace the pod moved out of, while its rules
	// there may still be in place: AddPod records it with the move and
	// clears it once that namespace is cleaned up, so a crash in between
	// leaves the cleanup to reconcile instead of to nobody.
	Leaving *Leaving `json:"leaving,omitempty"`
	// Removing is set by RemovePod before it touches the kernel: a call
	// that cannot write it changes nothing, and one that fails or dies
	// after it is finished by the next RemovePod or reconcile, which
	// release the pod instead of restoring its capture.
	Removing bool `json:"removing,omitempty"`
}

func (r *Record) stamp() {
	r.Kind = KindPod
	if r.Version == 0 {
		r.Version = Version
	}
}

// Leaving names a namespace to clean up: its path, its identity when the
// pod was enrolled there, and the routing installed there.
type Leaving struct {
	NetnsPath string  `json:"netnsPath"`
	NetnsID   string  `json:"netnsId"`
	Routing   Routing `json:"routing"`
}

// SpecRecord is nft.Spec in a stable JSON form (named fields, text
// addresses and modes), independent of nft's Go field names.
type SpecRecord struct {
	Mode             string `json:"mode"`
	OutboundPort     uint16 `json:"outboundPort"`
	InboundPort      uint16 `json:"inboundPort"`
	InboundHBONEPort uint16 `json:"inboundHbonePort"`
	DNSPort          uint16 `json:"dnsPort"`
	ProxyMark        Mark   `json:"proxyMark"`
	TProxyMark       Mark   `json:"tproxyMark"`
	ProbeSourceV4    string `json:"probeSourceV4,omitempty"`
	ProbeSourceV6    string `json:"probeSourceV6,omitempty"`
	// TProxyV4/V6: the TPROXY target addresses; absent or empty is none
	// (the family-less rule, which is what records written before the
	// option was added were enrolled with).
	TProxyV4             string   `json:"tproxyV4,omitempty"`
	TProxyV6             string   `json:"tproxyV6,omitempty"`
	CaptureDNS           bool     `json:"captureDns"`
	IPv6                 bool     `json:"ipv6"`
	InboundCapture       bool     `json:"inboundCapture"`
	ExcludeInboundPorts  []uint16 `json:"excludeInboundPorts,omitempty"`
	ExcludeOutboundPorts []uint16 `json:"excludeOutboundPorts,omitempty"`
	ExcludeOutboundCIDRs []string `json:"excludeOutboundCidrs,omitempty"`
	RerouteInterfaces    []string `json:"rerouteInterfaces,omitempty"`
}

// Mark is a value under a mask.
type Mark struct {
	Value uint32 `json:"value"`
	Mask  uint32 `json:"mask"`
}

// Routing is the policy routing installed with the pod, kept so that a
// release removes exactly what was added even if daemon flags changed.
type Routing struct {
	Mark     uint32 `json:"mark"`
	Mask     uint32 `json:"mask"`
	Table    int    `json:"table"`
	Priority int    `json:"priority"`
}

// RoutingOf is r as recorded.
func RoutingOf(r netns.Routing) Routing {
	return Routing{Mark: r.Mark, Mask: r.Mask, Table: r.Table, Priority: r.Priority}
}

// Netns is the recorded routing as netns installs it.
func (r Routing) Netns() netns.Routing {
	return netns.Routing{Mark: r.Mark, Mask: r.Mask, Table: r.Table, Priority: r.Priority}
}

// SpecOf is s as recorded.
func SpecOf(s nft.Spec) SpecRecord {
	r := SpecRecord{
		Mode:                 s.Mode.String(),
		OutboundPort:         s.OutboundPort,
		InboundPort:          s.InboundPort,
		InboundHBONEPort:     s.InboundHBONEPort,
		DNSPort:              s.DNSPort,
		ProxyMark:            Mark(s.ProxyMark),
		TProxyMark:           Mark(s.TProxyMark),
		CaptureDNS:           s.CaptureDNS,
		IPv6:                 s.IPv6,
		InboundCapture:       !s.NoInboundCapture,
		ExcludeInboundPorts:  slices.Clone(s.ExcludeInboundPorts),
		ExcludeOutboundPorts: slices.Clone(s.ExcludeOutboundPorts),
		RerouteInterfaces:    slices.Clone(s.RerouteInterfaces),
	}
	if s.ProbeSourceV4.IsValid() {
		r.ProbeSourceV4 = s.ProbeSourceV4.String()
	}
	if s.ProbeSourceV6.IsValid() {
		r.ProbeSourceV6 = s.ProbeSourceV6.String()
	}
	if s.TProxyAddrV4.IsValid() {
		r.TProxyV4 = s.TProxyAddrV4.String()
	}
	if s.TProxyAddrV6.IsValid() {
		r.TProxyV6 = s.TProxyAddrV6.String()
	}
	for _, c := range s.ExcludeOutboundCIDRs {
		r.ExcludeOutboundCIDRs = append(r.ExcludeOutboundCIDRs, c.String())
	}
	return r
}

// Spec rebuilds the nft.Spec for podUID.
func (r SpecRecord) Spec(podUID string) (nft.Spec, error) {
	mode, err := defaults.ParseCaptureMode(r.Mode)
	if err != nil {
		return nft.Spec{}, err
	}
	s := nft.Spec{
		PodID:                podUID,
		Mode:                 mode,
		OutboundPort:         r.OutboundPort,
		InboundPort:          r.InboundPort,
		InboundHBONEPort:     r.InboundHBONEPort,
		DNSPort:              r.DNSPort,
		ProxyMark:            nft.Mark(r.ProxyMark),
		TProxyMark:           nft.Mark(r.TProxyMark),
		CaptureDNS:           r.CaptureDNS,
		IPv6:                 r.IPv6,
		NoInboundCapture:     !r.InboundCapture,
		ExcludeInboundPorts:  slices.Clone(r.ExcludeInboundPorts),
		ExcludeOutboundPorts: slices.Clone(r.ExcludeOutboundPorts),
		RerouteInterfaces:    slices.Clone(r.RerouteInterfaces),
	}
	for _, a := range []struct {
		field, text string
		to          *netip.Addr
	}{
		{"probe source v4", r.ProbeSourceV4, &s.ProbeSourceV4},
		{"probe source v6", r.ProbeSourceV6, &s.ProbeSourceV6},
		{"tproxy v4", r.TProxyV4, &s.TProxyAddrV4},
		{"tproxy v6", r.TProxyV6, &s.TProxyAddrV6},
	} {
		// Empty is unset: the zero address, as in the spec.
		if a.text == "" {
			continue
		}
		if *a.to, err = netip.ParseAddr(a.text); err != nil {
			return nft.Spec{}, fmt.Errorf("%s: %w", a.field, err)
		}
	}
	for _, c := range r.ExcludeOutboundCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nft.Spec{}, fmt.Errorf("excluded CIDR: %w", err)
		}
		s.ExcludeOutboundCIDRs = append(s.ExcludeOutboundCIDRs, p)
	}
	return s, nil
}

// Ruleset builds the pod's ruleset from the record.
func (r *Record) Ruleset() (*nft.Ruleset, error) {
	s, err := r.Spec.Spec(r.PodUID)
	if err != nil {
		return nil, fmt.Errorf("record of pod %s: %w", r.PodUID, err)
	}
	return nft.Build(s)
}

// checkSpec refuses the records whose ruleset would not build, as
// Ruleset does, without encoding the rules: every read of a record checks
// it, and the Kubernetes agent reads a pod's record on each of the pod's
// events, where building the ruleset was most of a read's cost. A spec
// that validates always builds (FuzzRecordDecode holds every record Check
// accepts to that).
func (r *Record) checkSpec() error {
	s, err := r.Spec.Spec(r.PodUID)
	if err == nil {
		err = s.Validate()
	}
	if err != nil {
		return fmt.Errorf("record of pod %s: %w", r.PodUID, err)
	}
	return nil
}

// NamespaceID parses the recorded namespace identity.
func (r *Record) NamespaceID() (netns.ID, error) { return netns.ParseID(r.NetnsID) }

// Check rejects a record that cannot be acted on; such records are set
// aside rather than half-applied.
func (r *Record) Check() error {
	var errs []error
	if r.Version < 1 || r.Version > Version {
		errs = append(errs, fmt.Errorf("record version %d is not supported (this daemon reads 1..%d)", r.Version, Version))
	}
	if err := defaults.CheckPodUID(r.PodUID); err != nil {
		errs = append(errs, fmt.Errorf("pod_uid %w", err))
	}
	if !filepath.IsAbs(r.NetnsPath) {
		errs = append(errs, fmt.Errorf("netns path %q is not absolute", r.NetnsPath))
	}
	if id, err := r.NamespaceID(); err != nil {
		errs = append(errs, err)
	} else if id.IsZero() {
		errs = append(errs, errors.New("netns id is zero"))
	}
	if err := r.checkSpec(); err != nil {
		errs = append(errs, err)
	}
	if err := r.Routing.Netns().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SameIntent reports whether two records ask for the same enrolment,
// ignoring timestamps and whether the kind is stamped yet; a re-apply with the same intent is not an event.
func SameIntent(a, b *Record) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.EnrolledAt, x.UpdatedAt, x.Kind = time.Time{}, time.Time{}, ""
	y.EnrolledAt, y.UpdatedAt, y.Kind = time.Time{}, time.Time{}, ""
	return equalJSON(&x, &y)
}
