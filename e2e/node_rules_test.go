package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestDaemonNodeRulesWiped: the node's rules wiped behind the daemon's
// back (istio#60607: a firewall reload killed probes for good). A reload
// that deletes and recreates only its own tables leaves the node probe
// table alone; `nft flush ruleset` takes it with the enrolled pods'
// addresses, and the next reconcile pass puts it back, counted in
// nftredir_probe_table_repairs_total.
func TestDaemonNodeRulesWiped(t *testing.T) {
	nstest.RequirePrivileged(t)
	node := nstest.NewNetns(t)
	const interval = 500 * time.Millisecond
	d := startDaemon(t, daemonOpts{args: []string{
		"--probe-snat=true",
		"--node-netns", node.Path,
		"--kubelet-uid", "0",
		"--reconcile-interval", interval.String(),
		"--metrics-address", "127.0.0.1:0",
	}})
	addr := d.httpAddr(t)
	c := d.client(t)
	ips := map[string][]netip.Addr{
		"e2e-wiped-a": {netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("fd00:99::2")},
		"e2e-wiped-b": {netip.MustParseAddr("10.99.0.3")},
	}
	for uid, a := range ips {
		if _, err := c.AddPod(t.Context(), addPodReq(uid, uid, nstest.NewNetns(t), "", a...)); err != nil {
			t.Fatal(err)
		}
	}
	complete := func() bool {
		out, err := node.Exec("nft", "list", "table", "inet", nodeTable)
		if err != nil {
			return false
		}
		for _, a := range ips {
			for _, ip := range a {
				if !strings.Contains(out, ip.String()) {
					return false
				}
			}
		}
		return strings.Contains(out, "snat ip to") && strings.Contains(out, "snat ip6 to")
	}
	repairs := func() float64 { return counter(scrape(t, addr), "nftredir_probe_table_repairs_total", nil) }
	waitUntil := func(what string, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > 20*interval {
				t.Fatalf("%s: not within %s (reconcile interval %s)", what, time.Since(start).Round(time.Millisecond), interval)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitUntil("the node table with every pod's address", complete)
	if got := repairs(); got != 0 {
		t.Fatalf("nftredir_probe_table_repairs_total %v before anything was wiped; want 0", got)
	}

	script := filepath.Join(t.TempDir(), "firewalld.nft")
	if err := os.WriteFile(script, []byte("table inet firewalld\ndelete table inet firewalld\ntable inet firewalld {\n\tchain filter_INPUT {\n\t\ttype filter hook input priority filter + 10; policy accept;\n\t}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	node.Nft(t, "-f", script)
	node.Nft(t, "-f", script)
	time.Sleep(3 * interval)
	if !complete() || repairs() != 0 {
		t.Errorf("after a reload of another table: node table complete %v, repairs %v; want untouched and 0", complete(), repairs())
	}

	node.Nft(t, "flush", "ruleset")
	took := waitUntil("the node table back after nft flush ruleset", complete)
	waitUntil("the repair counted", func() bool { return repairs() == 1 })
	t.Logf("node table and both sets back %s after nft flush ruleset (reconcile interval %s)", took.Round(time.Millisecond), interval)

	node.Nft(t, "flush", "set", "inet", nodeTable, "pod-ips-v4")
	took = waitUntil("the IPv4 set refilled", complete)
	waitUntil("the second repair counted", func() bool { return repairs() == 2 })
	t.Logf("IPv4 set refilled %s after it was flushed", took.Round(time.Millisecond))
	if got := fmt.Sprint(repairs()); got != "2" {
		t.Errorf("repairs %s; want 2", got)
	}
}
