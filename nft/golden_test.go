package nft_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/golden"
	"github.com/nftredir/nftredir/nft"
)

type goldenCase struct {
	name string
	spec nft.Spec
}

// goldenCases covers every option that changes the ruleset.
func goldenCases() []goldenCase {
	base := func(mut func(*nft.Spec)) nft.Spec {
		s := nft.DefaultSpec("0b6f3c1e-pod")
		if mut != nil {
			mut(&s)
		}
		return s
	}
	return []goldenCase{
		{"tproxy_default", base(nil)},
		{"redirect_default", base(func(s *nft.Spec) { s.Mode = nft.ModeRedirect })},
		{"tproxy_dns", base(func(s *nft.Spec) { s.CaptureDNS = true })},
		{"redirect_dns", base(func(s *nft.Spec) { s.Mode = nft.ModeRedirect; s.CaptureDNS = true })},
		{"tproxy_ipv4_only", base(func(s *nft.Spec) { s.IPv6 = false })},
		{"redirect_ipv4_only", base(func(s *nft.Spec) { s.Mode = nft.ModeRedirect; s.IPv6 = false })},
		{"tproxy_ingress", base(func(s *nft.Spec) { s.NoInboundCapture = true })},
		{"redirect_ingress", base(func(s *nft.Spec) { s.Mode = nft.ModeRedirect; s.NoInboundCapture = true })},
		{"tproxy_excludes", base(func(s *nft.Spec) {
			s.ExcludeInboundPorts = []uint16{22, 8443}
			s.ExcludeOutboundPorts = []uint16{5432}
			s.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("fd00:10::/64")}
		})},
		{"redirect_excludes", base(func(s *nft.Spec) {
			s.Mode = nft.ModeRedirect
			s.ExcludeInboundPorts = []uint16{22}
			s.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
		})},
		{"custom_ports_marks", base(func(s *nft.Spec) {
			s.OutboundPort, s.InboundPort, s.InboundHBONEPort, s.DNSPort = 25001, 25006, 25008, 25053
			s.ProxyMark = nft.Mark{Value: 0x5000, Mask: 0xf000}
			s.TProxyMark = nft.Mark{Value: 0x0022, Mask: 0x00ff}
			s.CaptureDNS = true
		})},
		{"tproxy_to_destination", base(func(s *nft.Spec) { s.TProxyAddrV4, s.TProxyAddrV6 = netip.Addr{}, netip.Addr{} })},
		{"tproxy_custom_targets", base(func(s *nft.Spec) {
			s.TProxyAddrV4 = netip.MustParseAddr("169.254.7.1")
			s.TProxyAddrV6 = netip.Addr{}
		})},
		{"no_probe_sources", base(func(s *nft.Spec) { s.ProbeSourceV4, s.ProbeSourceV6 = netip.Addr{}, netip.Addr{} })},
		{"tproxy_reroute", base(func(s *nft.Spec) { s.RerouteInterfaces = []string{"k6t-eth0", "tap0"} })},
		{"redirect_reroute", base(func(s *nft.Spec) { s.Mode = nft.ModeRedirect; s.RerouteInterfaces = []string{"k6t-eth0"} })},
		{"tproxy_ingress_reroute", base(func(s *nft.Spec) { s.NoInboundCapture = true; s.RerouteInterfaces = []string{"docker0"} })},
	}
}

func TestBuildGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := nft.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, tc.name, rs.String())
			// The text does not pin the bytecode down (an offset or a
			// register can change under the same words); this does.
			golden.Check(t, tc.name+".bytecode", rs.Bytecode())
		})
	}
}

// TestWithoutCounters: the comparison ruleset of the benchmark is the
// same rules without their counters, and a table of its own (digest).
func TestWithoutCounters(t *testing.T) {
	rs, err := nft.Build(nft.DefaultSpec("0b6f3c1e-pod"))
	if err != nil {
		t.Fatal(err)
	}
	bare, err := rs.WithoutCounters()
	if err != nil {
		t.Fatal(err)
	}
	if bare.Digest == rs.Digest {
		t.Error("the ruleset without counters has the same digest")
	}
	if got, want := bare.String(), strings.ReplaceAll(strings.ReplaceAll(rs.String(), " counter packets 0 bytes 0", ""), rs.Digest, bare.Digest); got != want {
		t.Errorf("without counters:\n%s\nwant\n%s", got, want)
	}
}
