package probe_test

import (
	"net/netip"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/golden"
	"github.com/nftredir/nftredir/probe"
)

type goldenCase struct {
	name string
	spec probe.Spec
}

// goldenCases covers every option that changes the node table.
func goldenCases() []goldenCase {
	base := func(mut func(*probe.Spec)) probe.Spec {
		s := probe.DefaultSpec()
		if mut != nil {
			mut(&s)
		}
		return s
	}
	return []goldenCase{
		{"default", base(nil)},
		{"kubelet_uid", base(func(s *probe.Spec) { s.KubeletUID = 1000 })},
		{"ipv4_only", base(func(s *probe.Spec) { s.SourceV6 = netip.Addr{} })},
		{"ipv6_only", base(func(s *probe.Spec) { s.SourceV4 = netip.Addr{} })},
		{"custom_sources", base(func(s *probe.Spec) {
			s.SourceV4 = netip.MustParseAddr("169.254.99.1")
			s.SourceV6 = netip.MustParseAddr("fd00:99::99")
		})},
	}
}

func TestBuildGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := probe.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, tc.name, rs.String())
		})
	}
}

func TestBuildRejects(t *testing.T) {
	for name, s := range map[string]probe.Spec{
		"no sources":      {},
		"v6 as v4":        {SourceV4: netip.MustParseAddr("fd00::1")},
		"v4 as v6":        {SourceV6: netip.MustParseAddr("10.0.0.1")},
		"mapped v6":       {SourceV6: netip.MustParseAddr("::ffff:10.0.0.1")},
		"unspecified v4":  {SourceV4: netip.IPv4Unspecified()},
		"multicast v6":    {SourceV6: netip.MustParseAddr("ff02::1")},
		"zoned v6 source": {SourceV6: netip.MustParseAddr("fe80::1%eth0")},
	} {
		if _, err := probe.Build(s); err == nil {
			t.Errorf("%s: Build accepted %+v", name, s)
		}
	}
}

func TestDigestFollowsSpec(t *testing.T) {
	a, _ := probe.Build(probe.DefaultSpec())
	s := probe.DefaultSpec()
	s.KubeletUID = 1000
	b, _ := probe.Build(s)
	if a.Digest == b.Digest {
		t.Error("changing the kubelet uid does not change the digest: a live chain for uid 0 would pass for uid 1000")
	}
}

func TestParseAddrs(t *testing.T) {
	got, err := probe.ParseAddrs([]string{"10.0.0.1", "::ffff:10.0.0.2", "fd00::1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::1")}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("addr %d: got %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"10.0.0.300", "fe80::1%eth0", ""} {
		if _, err := probe.ParseAddrs([]string{bad}); err == nil {
			t.Errorf("ParseAddrs accepted %q", bad)
		}
	}
}
