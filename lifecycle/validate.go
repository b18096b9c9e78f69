package lifecycle

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// Validation is hand-written here rather than generated: the messages are
// the API's user interface, and each says what to change.

const (
	maxNetnsPathLen = 4096
	maxLabelLen     = 253 // a Kubernetes DNS subdomain, the longest name a pod field can be
	maxPodIPs       = 16
)

// addPod is a validated AddPodRequest with the daemon defaults applied.
type addPod struct {
	uid, name, namespace string
	netnsPath            string
	podIPs               []string
	serviceAccount       *string
	spec                 nft.Spec
}

// problems collects every defect of a request so that one reply lists
// them all instead of making the caller fix them one round trip at a time.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	const maxShown = 8 // a list of a thousand bad ports needs one line, not a thousand
	if len(p) > maxShown {
		p = append(p[:maxShown:maxShown], fmt.Sprintf("and %d more problems", len(p)-maxShown))
	}
	return invalidf("invalid request: %s", strings.Join(p, "; "))
}

func checkUID(p *problems, uid string) {
	if err := defaults.CheckPodUID(uid); err != nil {
		p.addf("pod_uid %v", err)
	}
}

// checkLabel validates the free-form descriptive fields, which are only
// logged and stored, but must not smuggle control characters into either.
func checkLabel(p *problems, field, v string) {
	if len(v) > maxLabelLen {
		p.addf("%s is %d bytes, at most %d allowed", field, len(v), maxLabelLen)
		return
	}
	if !utf8.ValidString(v) {
		p.addf("%s must be valid UTF-8", field)
		return
	}
	for _, r := range v {
		if !unicode.IsPrint(r) {
			p.addf("%s contains the non-printable character %q", field, r)
			return
		}
	}
}

func checkNetnsPath(p *problems, path string) {
	switch {
	case path == "":
		p.addf("netns_path is required (e.g. /var/run/netns/cni-1234 or /proc/PID/ns/net)")
	case len(path) > maxNetnsPathLen:
		p.addf("netns_path is %d bytes, at most %d allowed", len(path), maxNetnsPathLen)
	case strings.ContainsFunc(path, unicode.IsControl):
		p.addf("netns_path contains a control character")
	case !filepath.IsAbs(path):
		p.addf("netns_path %q is relative; give the absolute path of the pod's network namespace", path)
	case filepath.Clean(path) != path:
		p.addf("netns_path %q is not in clean form; use %q", path, filepath.Clean(path))
	}
}

func validateAdd(req *nftredirv1.AddPodRequest, defaults nft.Spec) (*addPod, error) {
	var p problems
	// The two fields whose rules are the daemon's vocabulary rather than
	// this file's (internal/defaults) come first: the pod's identity, and
	// the capture mode as the API names it.
	checkUID(&p, req.GetPodUid())
	mode, modeSet, err := apimode.FromAPI(req.GetOptions().GetCaptureMode())
	if err != nil {
		p.addf("options.capture_mode %v", err)
	}
	checkLabel(&p, "pod_name", req.GetPodName())
	checkLabel(&p, "pod_namespace", req.GetPodNamespace())
	if req.ServiceAccount != nil {
		checkLabel(&p, "service_account", req.GetServiceAccount())
	}
	checkNetnsPath(&p, req.GetNetnsPath())
	ips := podIPs(&p, req.GetPodIps())
	if modeSet {
		defaults.Mode = mode
	}
	spec := effectiveSpec(&p, req.GetPodUid(), req.GetOptions(), defaults)
	if err := p.err(); err != nil {
		return nil, err
	}
	a := &addPod{
		uid:       req.GetPodUid(),
		name:      req.GetPodName(),
		namespace: req.GetPodNamespace(),
		netnsPath: req.GetNetnsPath(),
		podIPs:    ips,
		spec:      spec,
	}
	if req.ServiceAccount != nil {
		sa := req.GetServiceAccount()
		a.serviceAccount = &sa
	}
	return a, nil
}

// podIPs parses and normalises the pod's addresses (sorted, deduplicated,
// canonical text), so the same pod given in another order records the same.
func podIPs(p *problems, in []string) []string {
	if len(in) > maxPodIPs {
		p.addf("pod_ips has %d entries, at most %d allowed", len(in), maxPodIPs)
		return nil
	}
	var addrs []netip.Addr
	for _, s := range in {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
			p.addf("pod_ips: %q is not an IP address (give addresses without prefix length, e.g. 10.244.1.7)", s)
			continue
		case a.Zone() != "":
			p.addf("pod_ips: %q has a zone; pod addresses are global", s)
			continue
		case a.Is4In6():
			p.addf("pod_ips: write %q in IPv4 form (%s)", s, a.Unmap())
			continue
		case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
			p.addf("pod_ips: %q cannot be a pod address", s)
			continue
		}
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	addrs = slices.Compact(addrs)
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}

// effectiveSpec fills every option the caller left unset from the daemon
// defaults (their capture mode already the caller's, if set: validateAdd
// resolves it first). Lists are sorted and deduplicated so that reordering them is
// not a change.
func effectiveSpec(p *problems, uid string, o *nftredirv1.RedirectOptions, defaults nft.Spec) nft.Spec {
	s := defaults
	s.PodID = uid
	s.ExcludeInboundPorts, s.ExcludeOutboundPorts, s.ExcludeOutboundCIDRs, s.RerouteInterfaces = nil, nil, nil, nil
	if o == nil {
		return s
	}
	if o.DnsCapture != nil {
		s.CaptureDNS = o.GetDnsCapture()
	}
	if o.Ipv6 != nil {
		s.IPv6 = o.GetIpv6()
	}
	if o.InboundCapture != nil {
		s.NoInboundCapture = !o.GetInboundCapture()
	}
	if o.TproxyIpv4 != nil {
		s.TProxyAddrV4 = tproxyAddr(p, "options.tproxy_ipv4", o.GetTproxyIpv4(), false)
	}
	if o.TproxyIpv6 != nil {
		s.TProxyAddrV6 = tproxyAddr(p, "options.tproxy_ipv6", o.GetTproxyIpv6(), true)
	}
	s.ExcludeInboundPorts = ports(p, "options.exclude_inbound_ports", o.GetExcludeInboundPorts())
	s.ExcludeOutboundPorts = ports(p, "options.exclude_outbound_ports", o.GetExcludeOutboundPorts())
	s.ExcludeOutboundCIDRs = cidrs(p, o.GetExcludeOutboundCidrs(), s.IPv6)
	s.RerouteInterfaces = interfaces(p, o.GetRerouteVirtualInterfaces())
	return s
}

// interfaces checks the rerouted interface names, sorted and
// deduplicated.
func interfaces(p *problems, in []string) []string {
	const field = "options.reroute_virtual_interfaces"
	var out []string
	for _, name := range in {
		if err := nft.CheckInterfaceName(name); err != nil {
			p.addf("%s: %v", field, err)
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > nft.MaxRerouteInterfaces {
		p.addf("%s has %d distinct names, at most %d allowed", field, len(out), nft.MaxRerouteInterfaces)
	}
	return out
}

// tproxyAddr parses a TPROXY target: "" is none (the zero address), else
// a unicast address of the field's family.
func tproxyAddr(p *problems, field, in string, v6 bool) netip.Addr {
	if in == "" {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(in)
	switch {
	case err != nil:
		p.addf("%s: %q is not an IP address", field, in)
	case !v6 && !a.Is4():
		p.addf("%s: %q is not an IPv4 address (e.g. 127.0.0.1)", field, in)
	case v6 && (!a.Is6() || a.Is4In6()):
		p.addf("%s: %q is not an IPv6 address (e.g. ::1)", field, in)
	case a.Zone() != "":
		p.addf("%s: %q has a zone", field, in)
	case a.IsUnspecified() || a.IsMulticast():
		p.addf("%s: %q is not a unicast address; give a local address such as loopback, or \"\" for none", field, in)
	default:
		return a
	}
	return netip.Addr{}
}

func ports(p *problems, field string, in []uint32) []uint16 {
	var out []uint16
	for _, v := range in {
		if v < 1 || v > 65535 {
			p.addf("%s: %d is not a port (1-65535)", field, v)
			continue
		}
		out = append(out, uint16(v))
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > nft.MaxExcludedPorts {
		p.addf("%s has %d distinct ports, at most %d allowed", field, len(out), nft.MaxExcludedPorts)
	}
	return out
}

func cidrs(p *problems, in []string, ipv6 bool) []netip.Prefix {
	const field = "options.exclude_outbound_cidrs"
	var out []netip.Prefix
	for _, s := range in {
		var pfx netip.Prefix
		if strings.Contains(s, "/") {
			v, err := netip.ParsePrefix(s)
			if err != nil {
				p.addf("%s: %q is not a CIDR (e.g. 10.0.0.0/8 or fd00::/8)", field, s)
				continue
			}
			pfx = v
		} else {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				p.addf("%s: %q is not a CIDR or address (e.g. 10.0.0.0/8 or 169.254.169.254)", field, s)
				continue
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		switch {
		case pfx.Addr().Is4In6():
			p.addf("%s: write %q in IPv4 form", field, s)
			continue
		case pfx != pfx.Masked():
			p.addf("%s: %q has host bits set; did you mean %s?", field, s, pfx.Masked())
			continue
		case pfx.Addr().Is6() && !ipv6:
			p.addf("%s: %q is IPv6 but IPv6 capture is off for this pod (options.ipv6)", field, s)
			continue
		}
		out = append(out, pfx)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out = slices.Compact(out)
	if len(out) > nft.MaxExcludedCIDRs {
		p.addf("%s has %d distinct entries, at most %d allowed", field, len(out), nft.MaxExcludedCIDRs)
	}
	return out
}

// validateUID checks the pod_uid of RemovePod and GetPod.
func validateUID(uid string) error {
	var p problems
	checkUID(&p, uid)
	return p.err()
}

// ValidateAddPod checks an AddPod request as AddPod does, without opening
// or touching any namespace, and returns the pod as AddPod would record
// it: defaults filled in, lists in canonical form; the namespace identity
// and the timestamps are left unset. The client fake answers with it, so
// that fake and daemon cannot disagree on what a request means.
func ValidateAddPod(req *nftredirv1.AddPodRequest, defaults nft.Spec) (*nftredirv1.Pod, error) {
	a, err := validateAdd(req, defaults)
	if err != nil {
		return nil, err
	}
	if _, err := nft.Build(a.spec); err != nil {
		return nil, invalidf("options: %v", err)
	}
	p := podProto(&state.Record{
		PodUID:         a.uid,
		PodName:        a.name,
		PodNamespace:   a.namespace,
		NetnsPath:      a.netnsPath,
		PodIPs:         a.podIPs,
		ServiceAccount: a.serviceAccount,
		Spec:           state.SpecOf(a.spec),
	})
	p.EnrolledAt, p.UpdatedAt = nil, nil
	return p, nil
}

// ValidateRemovePod checks a RemovePod request as RemovePod does: the
// pod_uid, and netns_path when given (a precondition, but it must be a
// path AddPod would have taken).
func ValidateRemovePod(req *nftredirv1.RemovePodRequest) error {
	var p problems
	checkUID(&p, req.GetPodUid())
	if path := req.GetNetnsPath(); path != "" {
		checkNetnsPath(&p, path)
	}
	return p.err()
}

// ValidatePodUID checks the pod_uid of RemovePod and GetPod as they do.
func ValidatePodUID(uid string) error { return validateUID(uid) }
