package nft_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// istioNftables is the start of istio-cni's native nftables ruleset
// (Istio 1.28+, cni/pkg/nftables testdata/default.golden): its own inet
// tables, which take-over deletes whole.
const istioNftables = `add table inet istio-ambient-nat
add chain inet istio-ambient-nat prerouting { type nat hook prerouting priority -100 ; }
add chain inet istio-ambient-nat output { type nat hook output priority -100 ; }
add chain inet istio-ambient-nat istio-prerouting
add chain inet istio-ambient-nat istio-output
add rule inet istio-ambient-nat output jump istio-output
add rule inet istio-ambient-nat prerouting jump istio-prerouting
add rule inet istio-ambient-nat istio-prerouting ip daddr != 127.0.0.1/32 tcp dport != 15008 mark and 0xfff != 0x539 counter redirect to :15006
add rule inet istio-ambient-nat istio-output meta l4proto tcp ip daddr != 127.0.0.1/32 mark and 0xfff != 0x539 counter redirect to :15001
add table inet istio-ambient-mangle
add chain inet istio-ambient-mangle prerouting { type filter hook prerouting priority -150 ; }
add chain inet istio-ambient-mangle istio-prerouting
add rule inet istio-ambient-mangle prerouting jump istio-prerouting
add rule inet istio-ambient-mangle istio-prerouting meta mark & 0xfff == 0x539 counter ct mark set ct mark & 0xfffff000 | 0x111
`

// TestFindForeignNamesEachAgent: FindForeign names linkerd's proxy-init
// chains, Istio's nftables tables and legacy tables with rules, and
// nothing else: not a CNI's own iptables-nft rules, not a legacy table
// a listing merely instantiated. Take-over then removes exactly what it
// named, in one batch, and leaves the rest.
func TestFindForeignNamesEachAgent(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	a := nft.NewNetlink()
	find := func(n *nstest.Netns) *nft.Foreign {
		t.Helper()
		// A fresh handle: legacy tables are read when it is opened.
		g, err := netns.NewGuard()
		if err != nil {
			t.Fatal(err)
		}
		h, err := g.Open(n.Path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		f, err := a.FindForeign(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	// Nothing foreign: a CNI's SNAT in ip nat, an empty legacy table.
	n := nstest.NewNetns(t)
	n.Run(t, "iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE")
	n.Run(t, "iptables-legacy", "-t", "mangle", "-L")
	if f := find(n); !f.Empty() {
		t.Errorf("a CNI's rule and an empty legacy table are reported as foreign capture: %s", f)
	}

	// linkerd's proxy-init (iptables-nft) beside the CNI's rule, and
	// Istio's nftables tables.
	for _, args := range [][]string{
		{"-t", "nat", "-N", "PROXY_INIT_REDIRECT"},
		{"-t", "nat", "-A", "PROXY_INIT_REDIRECT", "-p", "tcp", "-j", "REDIRECT", "--to-port", "4143"},
		{"-t", "nat", "-A", "PREROUTING", "-j", "PROXY_INIT_REDIRECT"},
		{"-t", "nat", "-N", "PROXY_INIT_OUTPUT"},
		{"-t", "nat", "-A", "PROXY_INIT_OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-port", "4140"},
		{"-t", "nat", "-A", "OUTPUT", "-j", "PROXY_INIT_OUTPUT"},
	} {
		n.Run(t, "iptables-nft", args...)
	}
	cmd := "nft -f - <<'EOF'\n" + istioNftables + "EOF\n"
	n.Run(t, "sh", "-c", cmd)
	f := find(n)
	want := "nftables table inet istio-ambient-mangle, nftables table inet istio-ambient-nat, " +
		"iptables-nft chain ip nat PROXY_INIT_OUTPUT, iptables-nft chain ip nat PROXY_INIT_REDIRECT"
	if got := f.String(); got != want {
		t.Errorf("FindForeign = %q\nwant          %q", got, want)
	}
	if len(f.Jumps) != 2 {
		t.Errorf("jumps into the foreign chains: %+v; want PREROUTING's and OUTPUT's", f.Jumps)
	}

	h := func() *netns.Handle {
		g, _ := netns.NewGuard()
		h, err := g.Open(n.Path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}()
	rs, err := nft.Build(nft.DefaultSpec("pod-foreign"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.TakeOver(ctx, h, rs, f); err != nil {
		t.Fatalf("TakeOver: %v", err)
	}
	ruleset := n.Nft(t, "list", "ruleset")
	for _, gone := range []string{"istio-ambient", "PROXY_INIT", "4143", "4140"} {
		if strings.Contains(ruleset, gone) {
			t.Errorf("%q survived the take-over:\n%s", gone, ruleset)
		}
	}
	for _, kept := range []string{"masquerade", "table inet nftredir"} {
		if !strings.Contains(ruleset, kept) {
			t.Errorf("%q is missing after the take-over:\n%s", kept, ruleset)
		}
	}
	if st, text, err := a.Verify(ctx, h, rs); err != nil || st != nft.StatusInSync {
		t.Errorf("our table after take-over: %v, %v\n%s", st, err, text)
	}

	// Stale knowledge: what was read is gone, so the batch is refused
	// whole, and our table (just replaced) is left as it was.
	before := n.Nft(t, "list", "ruleset")
	if err := a.TakeOver(ctx, h, rs, f); err == nil {
		t.Error("TakeOver of chains that are gone succeeded")
	}
	if after := n.Nft(t, "list", "ruleset"); after != before {
		t.Errorf("a refused take-over changed the ruleset\n--- before\n%s\n--- after\n%s", before, after)
	}

	// Legacy rules: named, never removable.
	n.Run(t, "iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001")
	f = find(n)
	if len(f.Legacy) != 1 || f.Removable() || !strings.Contains(f.String(), "legacy iptables table nat (1 entries") {
		t.Errorf("with a legacy rule: %s (removable %t)", f, f.Removable())
	}
}
