package nft_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

func requireRoot(t testing.TB) { nstest.RequirePrivileged(t) }

// scratchNetns creates a namespace for the test (removed after it) and
// opens it through the guard, as the daemon would.
func scratchNetns(t *testing.T) (*nstest.Netns, *netns.Handle) {
	t.Helper()
	n := nstest.NewNetns(t)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return n, h
}

// TestKernelListingMatchesRendering applies each golden spec and checks that
// the kernel, listed by nft itself, holds exactly what String() renders.
func TestKernelListingMatchesRendering(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			n, h := scratchNetns(t)
			rs, err := nft.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
				t.Fatal(err)
			}
			if got, want := n.Nft(t, "list", "table", "inet", nft.TableName), rs.String(); got != want {
				t.Errorf("nft list differs from rendering\n--- nft list\n%s\n--- String()\n%s", got, want)
			}
			st, _, err := nft.NewNetlink().Verify(context.Background(), h, rs)
			if err != nil || st != nft.StatusInSync {
				t.Errorf("Verify after Apply = %v, %v; want in sync", st, err)
			}
		})
	}
}

// TestVerifySeesCaptureRuleEdited edits each capture rule in place the way
// an operator (or anything with CAP_NET_ADMIN in the pod) could: same
// position, same comment, but only "meta l4proto tcp accept" left, which
// switches that capture off. Verify must see it from the expressions, show
// the kernel's rule in its text, and Apply must put the rule back.
func TestVerifySeesCaptureRuleEdited(t *testing.T) {
	requireRoot(t)
	redirect := nft.DefaultSpec("0b6f3c1e-pod")
	redirect.Mode = nft.ModeRedirect
	destination := nft.DefaultSpec("0b6f3c1e-pod")
	destination.TProxyAddrV4, destination.TProxyAddrV6 = netip.Addr{}, netip.Addr{}
	for _, tc := range []struct {
		name  string
		spec  nft.Spec
		chain string
		rule  string // a substring of the rule's text
	}{
		{"outbound redirect", nft.DefaultSpec("0b6f3c1e-pod"), "nat-output", fmt.Sprintf("redirect to :%d", defaults.OutboundPort)},
		{"inbound tproxy", nft.DefaultSpec("0b6f3c1e-pod"), "mangle-prerouting", fmt.Sprintf("tproxy ip to 127.0.0.1:%d", defaults.InboundPort)},
		{"inbound tproxy v6", nft.DefaultSpec("0b6f3c1e-pod"), "mangle-prerouting", fmt.Sprintf("tproxy ip6 to [::1]:%d", defaults.InboundPort)},
		{"inbound HBONE tproxy", nft.DefaultSpec("0b6f3c1e-pod"), "mangle-prerouting", fmt.Sprintf("tproxy ip to 127.0.0.1:%d", defaults.HBONEPort)},
		{"inbound HBONE tproxy v6", nft.DefaultSpec("0b6f3c1e-pod"), "mangle-prerouting", fmt.Sprintf("tproxy ip6 to [::1]:%d", defaults.HBONEPort)},
		{"inbound tproxy to destination", destination, "mangle-prerouting", fmt.Sprintf("tproxy to :%d", defaults.InboundPort)},
		{"inbound fail-closed drop", nft.DefaultSpec("0b6f3c1e-pod"), "mangle-prerouting", "meta l4proto tcp counter packets 0 bytes 0 drop"},
		{"REDIRECT-mode inbound nat", redirect, "nat-prerouting", fmt.Sprintf("redirect to :%d", defaults.InboundPort)},
		{"REDIRECT-mode outbound", redirect, "nat-output", fmt.Sprintf("redirect to :%d", defaults.OutboundPort)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, h := scratchNetns(t)
			rs, err := nft.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			a := nft.NewNetlink()
			if err := a.Apply(context.Background(), h, rs); err != nil {
				t.Fatal(err)
			}
			handle, orig := ruleHandle(t, n, tc.chain, tc.rule)
			edited := fmt.Sprintf("meta l4proto tcp accept comment %q", rs.Comment())
			n.Nft(t, "replace", "rule", "inet", nft.TableName, tc.chain, "handle", handle, "meta", "l4proto", "tcp", "accept", "comment", fmt.Sprintf("%q", rs.Comment()))
			if _, now := ruleHandle(t, n, tc.chain, "meta l4proto tcp accept comment"); now != edited {
				t.Fatalf("nft shows the edited rule as %q, want %q", now, edited)
			}

			st, text, err := a.Verify(context.Background(), h, rs)
			if err != nil {
				t.Fatal(err)
			}
			if st != nft.StatusDrifted {
				t.Errorf("Verify after replacing %q with %q = %s, want drifted\n%s", orig, edited, st, text)

			}
			if chain := chainText(text, tc.chain); !strings.Contains(chain, "\t\t"+edited+"\n") || strings.Contains(chain, orig) {
				t.Errorf("Verify's text of chain %s does not show the kernel's rule %q in place of %q:\n%s", tc.chain, edited, orig, text)
			}

			if err := a.Apply(context.Background(), h, rs); err != nil {
				t.Fatal(err)
			}
			if st, text, err := a.Verify(context.Background(), h, rs); err != nil || st != nft.StatusInSync {
				t.Errorf("Verify after re-Apply = %s, %v; want in sync\n%s", st, err, text)
			}
			if got := n.Nft(t, "list", "table", "inet", nft.TableName); got != rs.String() {
				t.Errorf("after re-Apply nft lists\n%s\nwant\n%s", got, rs.String())
			}
		})
	}
}

// TestVerifyShowsForeignExpression: an expression nftredir never writes
// (nftrace set, between the counter and the redirect) is shown in
// Verify's text, not hidden, and is drift.
func TestVerifyShowsForeignExpression(t *testing.T) {
	requireRoot(t)
	n, h := scratchNetns(t)
	rs, err := nft.Build(nft.DefaultSpec("0b6f3c1e-pod"))
	if err != nil {
		t.Fatal(err)
	}
	a := nft.NewNetlink()
	if err := a.Apply(context.Background(), h, rs); err != nil {
		t.Fatal(err)
	}
	handle, _ := ruleHandle(t, n, "nat-output", fmt.Sprintf("redirect to :%d", defaults.OutboundPort))
	n.Nft(t, "replace", "rule", "inet", nft.TableName, "nat-output", "handle", handle,
		"meta", "l4proto", "tcp", "counter", "meta", "nftrace", "set", "1", "redirect", "to", fmt.Sprintf(":%d", defaults.OutboundPort), "comment", fmt.Sprintf("%q", rs.Comment()))
	st, text, err := a.Verify(context.Background(), h, rs)
	if err != nil {
		t.Fatal(err)
	}
	if st != nft.StatusDrifted {
		t.Errorf("Verify with nftrace in the outbound rule = %s, want drifted\n%s", st, text)
	}
	want := "\t\tmeta l4proto tcp counter packets 0 bytes 0 [expr immediate "
	if chain := chainText(text, "nat-output"); !strings.Contains(chain, want) || !strings.Contains(chain, fmt.Sprintf("] redirect to :%d comment", defaults.OutboundPort)) {
		t.Errorf("Verify's text does not show the foreign expressions between the known words:\n%s", text)
	}
}

// ruleHandle finds the first rule of chain whose text contains sub and
// returns its handle and its text as nft prints it.
func ruleHandle(t *testing.T, n *nstest.Netns, chain, sub string) (handle, text string) {
	t.Helper()
	for l := range strings.Lines(n.Nft(t, "-a", "list", "chain", "inet", nft.TableName, chain)) {
		l = strings.TrimSpace(l)
		before, h, ok := strings.Cut(l, " # handle ")
		if ok && strings.Contains(before, sub) {
			return h, before
		}
	}
	t.Fatalf("no rule with %q in chain %s", sub, chain)
	return "", ""
}

// chainText is the part of a rendered table that is chain's body.
func chainText(table, chain string) string {
	_, rest, ok := strings.Cut(table, "\tchain "+chain+" {\n")
	if !ok {
		return ""
	}
	body, _, _ := strings.Cut(rest, "\t}\n")
	return body
}
