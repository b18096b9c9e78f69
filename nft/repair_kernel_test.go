package nft_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/nft"
)

var handleRE = regexp.MustCompile(`# handle (\d+)$`)

// ruleHandles lists the handles of every rule in each chain of our table.
func ruleHandles(t *testing.T, n *nstest.Netns, rs *nft.Ruleset) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, c := range rs.Chains {
		for _, l := range strings.Split(n.Nft(t, "-a", "list", "chain", "inet", nft.TableName, c.Name), "\n") {
			if m := handleRE.FindStringSubmatch(l); m != nil && !strings.HasPrefix(strings.TrimSpace(l), "chain ") {
				out[c.Name] = append(out[c.Name], m[1])
			}
		}
	}
	return out
}

// TestApplyRepairsOnlyWhatDrifted: a repair rewrites only what drifted,
// and the chains after a chain it adds (the kernel lists an added chain
// last). The rules of every other chain stay in the kernel as they were
// (same handles, so their counters keep counting), and the table ends in
// sync, listed by nft exactly as String renders it.
func TestApplyRepairsOnlyWhatDrifted(t *testing.T) {
	requireRoot(t)
	rs, err := nft.Build(nft.DefaultSpec("0b6f3c1e-pod"))
	if err != nil {
		t.Fatal(err)
	}
	first, last := rs.Chains[0], rs.Chains[len(rs.Chains)-1]
	var all []string
	for _, c := range rs.Chains {
		all = append(all, c.Name)
	}
	for _, tc := range []struct {
		name    string
		tamper  func(t *testing.T, n *nstest.Netns)
		touched []string // chains whose rules the repair rewrites
	}{
		{"rule inserted", func(t *testing.T, n *nstest.Netns) {
			n.Nft(t, "insert", "rule", "inet", nft.TableName, last.Name, "meta l4proto tcp accept")
		}, []string{last.Name}},
		{"policy drop", func(t *testing.T, n *nstest.Netns) {
			n.Nft(t, "add", "chain", "inet", nft.TableName, first.Name, "{ type filter hook prerouting priority mangle + 10; policy drop; }")
		}, all}, // the chains after it are re-added behind it, in order
		{"middle chain deleted", func(t *testing.T, n *nstest.Netns) {
			n.Nft(t, "delete", "chain", "inet", nft.TableName, rs.Chains[1].Name)
		}, all[1:]},
		{"foreign chain with a rule", func(t *testing.T, n *nstest.Netns) {
			n.Nft(t, "add", "chain", "inet", nft.TableName, "extra", "{ type filter hook input priority 0; policy accept; }")
			n.Nft(t, "add", "rule", "inet", nft.TableName, "extra", "counter")
		}, nil},
		{"dormant", func(t *testing.T, n *nstest.Netns) {
			n.Nft(t, "add", "table", "inet", nft.TableName, "{ flags dormant; }")
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, h := scratchNetns(t)
			ctx, a := context.Background(), nft.NewNetlink()
			if err := a.Apply(ctx, h, rs); err != nil {
				t.Fatal(err)
			}
			before := ruleHandles(t, n, rs)
			tc.tamper(t, n)
			if st, _, err := a.Verify(ctx, h, rs); err != nil || st != nft.StatusDrifted {
				t.Fatalf("Verify after tampering = %v, %v; want drifted", st, err)
			}
			if err := a.Apply(ctx, h, rs); err != nil {
				t.Fatal(err)
			}
			if st, text, err := a.Verify(ctx, h, rs); err != nil || st != nft.StatusInSync {
				t.Fatalf("Verify after the repair = %v, %v\n%s", st, err, text)
			}
			if got, want := n.Nft(t, "list", "table", "inet", nft.TableName), rs.String(); got != want {
				t.Errorf("nft list after the repair differs from rendering\n--- nft list\n%s\n--- String()\n%s", got, want)
			}
			after := ruleHandles(t, n, rs)
			for _, c := range rs.Chains {
				same, touched := slices.Equal(before[c.Name], after[c.Name]), slices.Contains(tc.touched, c.Name)
				if touched && same {
					t.Errorf("chain %s drifted but kept its rules %v", c.Name, after[c.Name])
				}
				if !touched && !same {
					t.Errorf("chain %s did not drift but its rules were rewritten: handles %v, then %v", c.Name, before[c.Name], after[c.Name])
				}
			}
		})
	}
}
