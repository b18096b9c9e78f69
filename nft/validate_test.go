package nft_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/nft"
)

func TestSpecValidateRejects(t *testing.T) {
	cases := []struct {
		name    string
		mut     func(*nft.Spec)
		wantErr string
	}{
		{"no pod id", func(s *nft.Spec) { s.PodID = "" }, "pod id is required"},
		{"pod id too long", func(s *nft.Spec) { s.PodID = strings.Repeat("a", defaults.MaxPodUIDLen+1) }, "at most 128"},
		{"pod id with quote", func(s *nft.Spec) { s.PodID = `a"b` }, "quote"},
		{"pod id with newline", func(s *nft.Spec) { s.PodID = "a\nb" }, "printable characters"},
		{"unknown mode", func(s *nft.Spec) { s.Mode = 7 }, "unknown capture mode"},
		{"zero port", func(s *nft.Spec) { s.InboundPort = 0 }, "inbound port must be set"},
		{"clashing ports", func(s *nft.Spec) { s.InboundPort = s.OutboundPort }, fmt.Sprint("are both ", defaults.OutboundPort)},
		{"dns port clash only when on", func(s *nft.Spec) { s.CaptureDNS = true; s.DNSPort = s.InboundHBONEPort }, fmt.Sprint("are both ", defaults.HBONEPort)},
		{"mark outside mask", func(s *nft.Spec) { s.ProxyMark = nft.Mark{Value: 0x1539, Mask: 0xfff} }, "bits outside its mask"},
		{"zero mark", func(s *nft.Spec) { s.TProxyMark = nft.Mark{Value: 0, Mask: 0xfff} }, "must not be zero"},
		{"same marks", func(s *nft.Spec) { s.TProxyMark = s.ProxyMark }, "indistinguishable"},
		{"v6 probe as v4", func(s *nft.Spec) { s.ProbeSourceV4 = netip.MustParseAddr("fd00::1") }, "not an IPv4"},
		{"excluded port zero", func(s *nft.Spec) { s.ExcludeInboundPorts = []uint16{0} }, "port 0"},
		{"too many ports", func(s *nft.Spec) { s.ExcludeOutboundPorts = make([]uint16, nft.MaxExcludedPorts+1) }, "at most 64"},
		{"cidr host bits", func(s *nft.Spec) {
			s.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8")}
		}, "did you mean 10.0.0.0/8"},
		{"v6 cidr with v6 off", func(s *nft.Spec) {
			s.IPv6 = false
			s.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00::/8")}
		}, "IPv6 capture is off"},
		{"reroute empty name", func(s *nft.Spec) { s.RerouteInterfaces = []string{""} }, "name is empty"},
		{"reroute name too long", func(s *nft.Spec) { s.RerouteInterfaces = []string{"a-sixteen-bytes!"[:16]} }, "at most 15"},
		{"reroute wildcard", func(s *nft.Spec) { s.RerouteInterfaces = []string{"veth*"} }, `contains '*'`},
		{"reroute slash", func(s *nft.Spec) { s.RerouteInterfaces = []string{"a/b"} }, `contains '/'`},
		{"reroute dotdot", func(s *nft.Spec) { s.RerouteInterfaces = []string{".."} }, "not an interface name"},
		{"reroute loopback", func(s *nft.Spec) { s.RerouteInterfaces = []string{"lo"} }, "cannot be rerouted"},
		{"too many reroutes", func(s *nft.Spec) {
			for i := range nft.MaxRerouteInterfaces + 1 {
				s.RerouteInterfaces = append(s.RerouteInterfaces, fmt.Sprintf("tap%d", i))
			}
		}, "at most 16"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := nft.DefaultSpec("pod-1")
			tc.mut(&s)
			_, err := nft.Build(s)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Build error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestDigestTracksSpec(t *testing.T) {
	a, err := nft.Build(nft.DefaultSpec("pod-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, _ := nft.Build(nft.DefaultSpec("pod-1"))
	if a.Digest != again.Digest {
		t.Fatalf("equal specs gave digests %s and %s", a.Digest, again.Digest)
	}
	other := nft.DefaultSpec("pod-1")
	other.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	b, _ := nft.Build(other)
	c, _ := nft.Build(nft.DefaultSpec("pod-2"))
	if a.Digest == b.Digest || a.Digest == c.Digest {
		t.Fatalf("different specs share a digest: %s %s %s", a.Digest, b.Digest, c.Digest)
	}
}
