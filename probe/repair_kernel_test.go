package probe_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/nftredir/nftredir/probe"
)

// TestRepairsAfterRulesetWiped: the node's rules are wiped the ways a
// firewall reload or an operator wipes them (istio#60607): a reload that
// deletes and recreates only its own tables leaves ours alone and is no
// repair; `nft flush ruleset` (and a flushed set) takes the table with the
// enrolled pods' addresses, and the next Reconcile (what the daemon runs
// every reconcile interval) puts all of it back and counts one repair.
func TestRepairsAfterRulesetWiped(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	pods := map[string][]netip.Addr{podA: {ip4, ip6}, podB: {ip4b}}
	want := map[netip.Addr]string{ip4: podA, ip6: podA, ip4b: podB}
	reconcile := func(what string, repairs int64) {
		t.Helper()
		if err := m.Reconcile(ctx, pods); err != nil {
			t.Fatalf("%s: Reconcile: %v", what, err)
		}
		if got := stripElements(listTable(t, node)); got != m.Ruleset().String() {
			t.Errorf("%s: table after Reconcile\n%s\nwant\n%s", what, got, m.Ruleset().String())
		}
		wantElements(t, node, m, want)
		if got := m.Repairs(); got != repairs {
			t.Errorf("%s: Repairs() = %d, want %d", what, got, repairs)
		}
	}
	reconcile("first install", 0)

	// firewalld's reload: its own table deleted and recreated, in one
	// transaction, nothing else touched.
	script := filepath.Join(t.TempDir(), "firewalld.nft")
	if err := os.WriteFile(script, []byte(`table inet firewalld
delete table inet firewalld
table inet firewalld {
	chain filter_INPUT {
		type filter hook input priority filter + 10; policy accept;
		ct state established,related accept
	}
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		node.Nft(t, "-f", script)
	}
	reconcile("firewalld-style reload", 0)

	node.Nft(t, "flush", "ruleset")
	if p, err := m.Problems(ctx); err != nil || len(p) == 0 {
		t.Fatalf("Problems after nft flush ruleset = %v, %v; want the table missing", p, err)
	}
	reconcile("nft flush ruleset", 1)

	node.Nft(t, "flush", "set", "inet", probe.TableName, probe.SetV4)
	reconcile("set flushed", 2)

	// Nothing changed since: no repair.
	reconcile("untouched", 2)
}
