package probe_test

import (
	"context"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/probe"
)

var (
	podA = "0b6f3c1e-aaaa"
	podB = "0b6f3c1e-bbbb"
	ip4  = netip.MustParseAddr("10.99.0.2")
	ip4b = netip.MustParseAddr("10.99.0.3")
	ip6  = netip.MustParseAddr("fd00:99::2")
)

// newNode makes a namespace to stand for the node and a Manager for it.
func newNode(t testing.TB, cfg probe.Config) (*nstest.Netns, *probe.Manager) {
	t.Helper()
	node := nstest.NewNetns(t)
	cfg.NetnsPath = node.Path
	m, err := probe.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return node, m
}

func listTable(t *testing.T, node *nstest.Netns) string {
	t.Helper()
	return node.Nft(t, "list", "table", "inet", probe.TableName)
}

var elemRE = regexp.MustCompile(`^([0-9a-f.:]+)(?: comment "([^"]*)")?$`)

// nftElements reads the sets with the nft binary, independently of the
// library the Manager uses.
func nftElements(t *testing.T, node *nstest.Netns) map[netip.Addr]string {
	t.Helper()
	out := map[netip.Addr]string{}
	for _, set := range []string{probe.SetV4, probe.SetV6} {
		text := node.Nft(t, "list", "set", "inet", probe.TableName, set)
		i := strings.Index(text, "elements = {")
		if i < 0 {
			continue
		}
		body := text[i+len("elements = {"):]
		body = body[:strings.Index(body, "}")]
		for _, e := range strings.Split(body, ",") {
			e = strings.Join(strings.Fields(e), " ")
			m := elemRE.FindStringSubmatch(e)
			if m == nil {
				t.Fatalf("cannot parse element %q in\n%s", e, text)
			}
			out[netip.MustParseAddr(m[1])] = m[2]
		}
	}
	return out
}

// wantElements checks the sets once the Manager has sent what it queued
// (Remove does not wait for the kernel).
func wantElements(t *testing.T, node *nstest.Netns, m *probe.Manager, want map[netip.Addr]string) {
	t.Helper()
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := nftElements(t, node); !maps.Equal(got, want) {
		t.Errorf("elements (nft list) = %v, want %v", got, want)
	}
	got, err := m.Elements(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("elements (Manager) = %v, want %v", got, want)
	}
}

func TestKernelListingMatchesRendering(t *testing.T) {
	cases := map[string]probe.Config{
		"default":        {},
		"kubelet_uid":    {KubeletUID: 1000},
		"ipv4_only":      {NoIPv6: true},
		"ipv6_only":      {NoIPv4: true},
		"custom_sources": {SourceV4: netip.MustParseAddr("169.254.99.1"), SourceV6: netip.MustParseAddr("fd00:99::99")},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		t.Run(name, func(t *testing.T) {
			node, m := newNode(t, cases[name])
			ctx := context.Background()
			if err := m.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			// The kernel, listed by nft itself, holds exactly the golden.
			golden, err := os.ReadFile(filepath.Join("testdata", name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			if got := listTable(t, node); got != string(golden) || got != m.Ruleset().String() {
				t.Errorf("nft list differs from the golden\n--- nft list\n%s\n--- golden\n%s", got, golden)
			}
			if p, err := m.Problems(ctx); err != nil || len(p) > 0 {
				t.Errorf("Problems after Ensure = %v, %v", p, err)
			}
			// Idempotent, and without touching the kernel: handles stay.
			before := node.Nft(t, "-a", "list", "table", "inet", probe.TableName)
			if err := m.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			if err := m.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if after := node.Nft(t, "-a", "list", "table", "inet", probe.TableName); after != before {
				t.Errorf("a second Ensure changed the table\n--- before\n%s\n--- after\n%s", before, after)
			}
		})
	}
}

func TestKernelOwnershipSurvivesIPReuse(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	if err := m.Add(ctx, podA, []netip.Addr{ip4, ip6}); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podA, ip6: podA})
	// podB gets podA's IPv4 address before podA is released.
	if err := m.Add(ctx, podB, []netip.Addr{ip4}); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podB, ip6: podA})
	if err := m.Remove(ctx, podA); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podB})
	if err := m.Remove(ctx, podA); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if err := m.Remove(ctx, podB); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{})
}

func TestKernelRemoveHandsAddressToRemainingPod(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	for _, add := range []struct {
		uid   string
		addrs []netip.Addr
	}{{podA, []netip.Addr{ip4}}, {podB, []netip.Addr{ip4, ip4b}}} {
		if err := m.Add(ctx, add.uid, add.addrs); err != nil {
			t.Fatal(err)
		}
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podB, ip4b: podB})
	if err := m.Remove(ctx, podB); err != nil {
		t.Fatal(err)
	}
	// podA still claims ip4: its probes must keep bypassing capture.
	wantElements(t, node, m, map[netip.Addr]string{ip4: podA})
	// A re-add with other addresses releases the old one.
	if err := m.Add(ctx, podA, []netip.Addr{ip4b}); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4b: podA})
}

func TestKernelReconcileRepairsFlushedRuleset(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	pods := map[string][]netip.Addr{podA: {ip4, ip6}, podB: {ip4b}}
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]string{ip4: podA, ip6: podA, ip4b: podB}
	wantElements(t, node, m, want)

	node.Nft(t, "flush", "ruleset")
	if p, err := m.Problems(ctx); err != nil || len(p) == 0 {
		t.Fatalf("Problems after flush ruleset = %v, %v; want the table reported missing", p, err)
	}
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, want)
	if got := stripElements(listTable(t, node)); got != m.Ruleset().String() {
		t.Errorf("table after repair\n%s\nwant\n%s", got, m.Ruleset().String())
	}

	// A stranger's element and a wrong owner are corrected; a missing
	// element comes back.
	node.Nft(t, "add", "element", "inet", probe.TableName, probe.SetV4, `{ 10.77.0.1 comment "stranger" }`)
	node.Nft(t, "delete", "element", "inet", probe.TableName, probe.SetV4, "{ "+ip4b.String()+" }")
	node.Nft(t, "add", "element", "inet", probe.TableName, probe.SetV4, "{ "+ip4b.String()+` comment "stranger" }`)
	node.Nft(t, "delete", "element", "inet", probe.TableName, probe.SetV6, "{ "+ip6.String()+" }")
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, want)
}

// TestKernelEnsureRepairsRuleEditedInPlace: the SNAT rule replaced under
// the same comment by one that no longer SNATs (probes would then reach
// the pod with the node's address and be captured) is seen from the
// expressions and rewritten, and the elements stay.
func TestKernelEnsureRepairsRuleEditedInPlace(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	if err := m.Add(ctx, podA, []netip.Addr{ip4, ip6}); err != nil {
		t.Fatal(err)
	}
	var handle string
	for l := range strings.Lines(node.Nft(t, "-a", "list", "chain", "inet", probe.TableName, probe.ChainName)) {
		if before, h, ok := strings.Cut(strings.TrimSpace(l), " # handle "); ok && strings.Contains(before, "snat ip to") {
			handle = h
		}
	}
	if handle == "" {
		t.Fatal("no IPv4 SNAT rule listed")
	}
	node.Nft(t, "replace", "rule", "inet", probe.TableName, probe.ChainName, "handle", handle,
		"meta", "l4proto", "tcp", "meta", "skuid", "0", "ip", "daddr", "@"+probe.SetV4, "accept",
		"comment", `"`+m.Ruleset().Comment()+`"`)
	if p, err := m.Problems(ctx); err != nil || len(p) == 0 {
		t.Fatalf("Problems after the SNAT rule was edited in place = %v, %v; want the chain reported", p, err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := m.Problems(ctx); err != nil || len(p) != 0 {
		t.Errorf("Problems after Ensure = %v, %v; want none", p, err)
	}
	if got := stripElements(listTable(t, node)); got != m.Ruleset().String() {
		t.Errorf("table after Ensure\n%s\nwant\n%s", got, m.Ruleset().String())
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podA, ip6: podA})
}

var setBlockRE = regexp.MustCompile(`(?s)\tset [^\n]* \{\n.*?\n\t\}\n\n`)

func sameIgnoringSetOrder(a, b string) bool {
	setsA, setsB := setBlockRE.FindAllString(a, -1), setBlockRE.FindAllString(b, -1)
	slices.Sort(setsA)
	slices.Sort(setsB)
	return slices.Equal(setsA, setsB) && setBlockRE.ReplaceAllString(a, "") == setBlockRE.ReplaceAllString(b, "")
}

// stripElements drops the element lines nft prints inside sets.
func stripElements(listing string) string {
	var out []string
	skipping := false
	for _, line := range strings.SplitAfter(listing, "\n") {
		if strings.Contains(line, "elements = {") {
			skipping = true
		}
		if !skipping {
			out = append(out, line)
		}
		if skipping && strings.Contains(line, "}") {
			skipping = false
		}
	}
	return strings.Join(out, "")
}

func TestKernelEnsureKeepsElementsWhenOnlyTheChainDrifted(t *testing.T) {
	node, m := newNode(t, probe.Config{KubeletUID: 1000})
	ctx := context.Background()
	if err := m.Add(ctx, podA, []netip.Addr{ip4, ip6}); err != nil {
		t.Fatal(err)
	}
	setHandles := func() string {
		var hs []string
		for _, set := range []string{probe.SetV4, probe.SetV6} {
			out := node.Nft(t, "-a", "list", "set", "inet", probe.TableName, set)
			hs = append(hs, regexp.MustCompile(`# handle \d+`).FindString(out))
		}
		return strings.Join(hs, ",")
	}
	before := setHandles()
	tampers := map[string][]string{
		"rule deleted": {"flush chain inet " + probe.TableName + " " + probe.ChainName},
		"rule added":   {"add rule inet " + probe.TableName + " " + probe.ChainName + " tcp dport 22 accept"},
		"priority changed": {
			"delete chain inet " + probe.TableName + " " + probe.ChainName,
			"add chain inet " + probe.TableName + " " + probe.ChainName + " { type nat hook postrouting priority 50; }",
		},
		"extra chain and set": {
			"add set inet " + probe.TableName + " extra { type ipv4_addr; }",
			"add chain inet " + probe.TableName + " extra { type filter hook output priority 0; }",
			"add rule inet " + probe.TableName + " extra ip daddr @extra drop",
		},
	}
	for _, name := range slices.Sorted(maps.Keys(tampers)) {
		for _, cmd := range tampers[name] {
			node.Nft(t, strings.Fields(cmd)...)
		}
		if p, _ := m.Problems(ctx); len(p) == 0 {
			t.Errorf("%s: Problems reports nothing", name)
		}
		if err := m.Ensure(ctx); err != nil {
			t.Fatalf("%s: Ensure: %v", name, err)
		}
		if got := stripElements(listTable(t, node)); got != m.Ruleset().String() {
			t.Errorf("%s: table after Ensure\n%s\nwant\n%s", name, got, m.Ruleset().String())
		}
		wantElements(t, node, m, map[netip.Addr]string{ip4: podA, ip6: podA})
		if after := setHandles(); after != before {
			t.Errorf("%s: sets were recreated (handles %s, then %s)", name, before, after)
		}
	}
}

func TestKernelEnsureReplacesWrongSetAndWakesDormantTable(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	if err := m.Add(ctx, podA, []netip.Addr{ip4, ip6}); err != nil {
		t.Fatal(err)
	}
	// A set of the right name with the wrong flags, and the table asleep.
	node.Nft(t, "flush", "chain", "inet", probe.TableName, probe.ChainName)
	node.Nft(t, "delete", "set", "inet", probe.TableName, probe.SetV4)
	node.Nft(t, "add", "set", "inet", probe.TableName, probe.SetV4, "{ type ipv4_addr; flags interval; }")
	node.Nft(t, "add", "table", "inet", probe.TableName, "{ flags dormant; }")
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	// nft lists sets in creation order, so the replaced set now comes last.
	if got := stripElements(listTable(t, node)); !sameIgnoringSetOrder(got, m.Ruleset().String()) {
		t.Errorf("table after Ensure\n%s\nwant\n%s", got, m.Ruleset().String())
	}
	// The replaced set is seeded from what the Manager knows.
	wantElements(t, node, m, map[netip.Addr]string{ip4: podA, ip6: podA})
}

func TestKernelUninstall(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	if err := m.Add(ctx, podA, []netip.Addr{ip4}); err != nil {
		t.Fatal(err)
	}
	if err := m.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if out := node.Nft(t, "list", "ruleset"); strings.Contains(out, probe.TableName) {
		t.Errorf("table still there after Uninstall:\n%s", out)
	}
	if err := m.Uninstall(ctx); err != nil {
		t.Errorf("second Uninstall: %v", err)
	}
}

func TestNewRefusesNonNetns(t *testing.T) {
	for _, path := range []string{"/proc/self/ns/mnt", "/nonexistent/netns"} {
		if _, err := probe.New(probe.Config{NetnsPath: path}); err == nil {
			t.Errorf("New accepted %s as the node namespace", path)
		}
	}
}
