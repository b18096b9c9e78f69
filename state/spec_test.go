package state

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/nftredir/nftredir/nft"
)

// TestSpecOfIsLossless: AddPod applies the ruleset it builds from the
// spec it validated and records SpecOf that spec; reconcile holds the
// kernel to the ruleset the record rebuilds once read back from disk. The
// two must be one table, for every field a request or a flag can set.
func TestSpecOfIsLossless(t *testing.T) {
	full := nft.DefaultSpec("pod-full")
	full.Mode = nft.ModeRedirect
	full.CaptureDNS, full.IPv6, full.NoInboundCapture = true, true, true
	full.ProbeSourceV4 = netip.MustParseAddr("169.254.7.127")
	full.ProbeSourceV6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
	full.ExcludeInboundPorts = []uint16{22, 8080}
	full.ExcludeOutboundPorts = []uint16{443}
	full.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("169.254.169.254/32"), netip.MustParsePrefix("fd00::/8")}
	full.RerouteInterfaces = []string{"k6t-eth0", "tap0"}
	tproxy := nft.DefaultSpec("pod-tproxy")
	tproxy.Mode = nft.ModeTProxy
	tproxy.TProxyAddrV4 = netip.MustParseAddr("127.0.0.1")
	tproxy.TProxyAddrV6 = netip.MustParseAddr("::1")
	tproxy.IPv6 = true

	dir := t.TempDir()
	st, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []nft.Spec{nft.DefaultSpec("pod-default"), full, tproxy} {
		built, err := nft.Build(s)
		if err != nil {
			t.Fatalf("%s: %v", s.PodID, err)
		}
		r := testRecord(s.PodID)
		r.Spec = SpecOf(s)
		if err := st.Put(r); err != nil {
			t.Fatal(err)
		}
		back, err := st.Get(s.PodID)
		if err != nil || back == nil {
			t.Fatalf("%s: read back %v, %v (%s)", s.PodID, back, err, filepath.Join(dir, fileName(s.PodID)))
		}
		rs, err := back.Ruleset()
		if err != nil {
			t.Fatalf("%s: %v", s.PodID, err)
		}
		if rs.Digest != built.Digest || rs.String() != built.String() {
			t.Errorf("%s: the record rebuilds\n%s\nwhere the spec built\n%s", s.PodID, rs, built)
		}
	}
}

// BenchmarkRulesetOfRecord is what AddPod paid for its ruleset before it
// built it straight from the validated spec: the spec converted to the
// record's form and back (addresses and CIDRs parsed again), then built.
// BenchmarkRulesetOfSpec is what it pays now.
func BenchmarkRulesetOfRecord(b *testing.B) {
	s := benchSpec()
	for b.Loop() {
		r := &Record{PodUID: s.PodID, Spec: SpecOf(s)}
		if _, err := r.Ruleset(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRulesetOfSpec(b *testing.B) {
	s := benchSpec()
	for b.Loop() {
		r := &Record{PodUID: s.PodID, Spec: SpecOf(s)}
		if _, err := nft.Build(s); err != nil || r.PodUID == "" {
			b.Fatal(err)
		}
	}
}

func benchSpec() nft.Spec {
	s := nft.DefaultSpec("bench-pod")
	s.ExcludeInboundPorts = []uint16{22, 8080}
	s.ExcludeOutboundPorts = []uint16{443}
	s.ExcludeOutboundCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("169.254.169.254/32")}
	return s
}
