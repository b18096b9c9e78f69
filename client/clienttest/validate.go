package clienttest

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// The daemon's request limits. The contract suite (package contract)
// checks the fake against the daemon on each of them.
const (
	maxNetnsPathLen = 4096
	maxLabelLen     = 253
	maxPodIPs       = 16
	maxExcluded     = 64
)

// problems collects every defect of a request, as the daemon lists them
// all in one InvalidArgument.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "invalid request: %s", strings.Join(p, "; "))
}

func validateUID(uid string) error {
	var p problems
	checkUID(&p, uid)
	return p.err()
}

func checkUID(p *problems, uid string) {
	if err := defaults.CheckPodUID(uid); err != nil {
		p.addf("pod_uid %v", err)
	}
}

// validateAdd checks req and returns the pod record the daemon would
// keep: defaults filled in, lists sorted, deduplicated and in canonical
// form. Timestamps and the namespace id are left to the caller.
func validateAdd(req *nftredirv1.AddPodRequest) (*nftredirv1.Pod, error) {
	var p problems
	checkUID(&p, req.GetPodUid())
	checkLabel(&p, "pod_name", req.GetPodName())
	checkLabel(&p, "pod_namespace", req.GetPodNamespace())
	if req.ServiceAccount != nil {
		checkLabel(&p, "service_account", req.GetServiceAccount())
	}
	checkNetnsPath(&p, req.GetNetnsPath())
	ips := podIPs(&p, req.GetPodIps())
	opts := effective(&p, req.GetOptions())
	if err := p.err(); err != nil {
		return nil, err
	}
	return &nftredirv1.Pod{
		PodUid:         req.GetPodUid(),
		PodName:        req.GetPodName(),
		PodNamespace:   req.GetPodNamespace(),
		NetnsPath:      req.GetNetnsPath(),
		PodIps:         ips,
		Options:        opts,
		ServiceAccount: req.ServiceAccount,
	}, nil
}

func checkLabel(p *problems, field, v string) {
	switch {
	case len(v) > maxLabelLen:
		p.addf("%s is %d bytes, at most %d allowed", field, len(v), maxLabelLen)
	case !utf8.ValidString(v):
		p.addf("%s must be valid UTF-8", field)
	case strings.ContainsFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }):
		p.addf("%s contains a non-printable character", field)
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

func podIPs(p *problems, in []string) []string {
	if len(in) > maxPodIPs {
		p.addf("pod_ips has %d entries, at most %d allowed", len(in), maxPodIPs)
		return nil
	}
	var addrs []netip.Addr
	for _, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() {
			p.addf("pod_ips: %q is not a pod address", s)
			continue
		}
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

// effective fills unset options with the daemon defaults and normalises
// the lists.
func effective(p *problems, o *nftredirv1.RedirectOptions) *nftredirv1.RedirectOptions {
	e := DefaultOptions()
	if o == nil {
		return e
	}
	if m, set, err := apimode.FromAPI(o.GetCaptureMode()); err != nil {
		p.addf("options.capture_mode %v", err)
	} else if set {
		e.CaptureMode = apimode.ToAPI(m)
	}
	if o.DnsCapture != nil {
		e.DnsCapture = proto.Bool(o.GetDnsCapture())
	}
	if o.Ipv6 != nil {
		e.Ipv6 = proto.Bool(o.GetIpv6())
	}
	if o.InboundCapture != nil {
		e.InboundCapture = proto.Bool(o.GetInboundCapture())
	}
	if o.TproxyIpv4 != nil {
		e.TproxyIpv4 = proto.String(tproxyAddr(p, "options.tproxy_ipv4", o.GetTproxyIpv4(), false))
	}
	if o.TproxyIpv6 != nil {
		e.TproxyIpv6 = proto.String(tproxyAddr(p, "options.tproxy_ipv6", o.GetTproxyIpv6(), true))
	}
	e.ExcludeInboundPorts = ports(p, "options.exclude_inbound_ports", o.GetExcludeInboundPorts())
	e.ExcludeOutboundPorts = ports(p, "options.exclude_outbound_ports", o.GetExcludeOutboundPorts())
	e.ExcludeOutboundCidrs = cidrs(p, o.GetExcludeOutboundCidrs(), e.GetIpv6())
	return e
}

// tproxyAddr returns the canonical text of a TPROXY target; "" is none.
func tproxyAddr(p *problems, field, in string, v6 bool) string {
	if in == "" {
		return ""
	}
	a, err := netip.ParseAddr(in)
	if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || (v6 && (!a.Is6() || a.Is4In6())) || (!v6 && !a.Is4()) {
		p.addf("%s: %q is not a unicast address of the field's family", field, in)
		return ""
	}
	return a.String()
}

func ports(p *problems, field string, in []uint32) []uint32 {
	var out []uint32
	for _, v := range in {
		if v < 1 || v > 65535 {
			p.addf("%s: %d is not a port (1-65535)", field, v)
			continue
		}
		out = append(out, v)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > maxExcluded {
		p.addf("%s has %d distinct ports, at most %d allowed", field, len(out), maxExcluded)
	}
	return out
}

func cidrs(p *problems, in []string, ipv6 bool) []string {
	const field = "options.exclude_outbound_cidrs"
	var pfxs []netip.Prefix
	for _, s := range in {
		pfx, err := netip.ParsePrefix(s)
		if !strings.Contains(s, "/") {
			var a netip.Addr
			if a, err = netip.ParseAddr(s); err == nil && a.Zone() == "" {
				pfx = netip.PrefixFrom(a, a.BitLen())
			} else if err == nil {
				err = fmt.Errorf("zone")
			}
		}
		switch {
		case err != nil:
			p.addf("%s: %q is not a CIDR or address", field, s)
		case pfx.Addr().Is4In6():
			p.addf("%s: write %q in IPv4 form", field, s)
		case pfx != pfx.Masked():
			p.addf("%s: %q has host bits set; did you mean %s?", field, s, pfx.Masked())
		case pfx.Addr().Is6() && !ipv6:
			p.addf("%s: %q is IPv6 but IPv6 capture is off for this pod (options.ipv6)", field, s)
		default:
			pfxs = append(pfxs, pfx)
		}
	}
	slices.SortFunc(pfxs, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	pfxs = slices.Compact(pfxs)
	if len(pfxs) > maxExcluded {
		p.addf("%s has %d distinct entries, at most %d allowed", field, len(pfxs), maxExcluded)
	}
	var out []string
	for _, c := range pfxs {
		out = append(out, c.String())
	}
	return out
}
