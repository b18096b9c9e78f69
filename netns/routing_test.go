package netns_test

import (
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
)

// routingSeen is our routing as the ip binary shows it, per family.
type routingSeen struct {
	rules  []string // `ip rule` lines with our fwmark
	routes []string // routes in table 100
}

func observeRouting(t *testing.T, ns *nstest.Netns, family string) routingSeen {
	t.Helper()
	var s routingSeen
	for _, l := range strings.Split(ns.IP(t, family, "rule", "show"), "\n") {
		if strings.Contains(l, "fwmark 0x111/0xfff") || strings.Contains(l, "lookup 100") {
			s.rules = append(s.rules, strings.TrimSpace(l))
		}
	}
	// `ip route show table 100` fails once the table is gone; table all
	// lists it only while it exists.
	for _, l := range strings.Split(ns.IP(t, family, "route", "show", "table", "all"), "\n") {
		if strings.Contains(l, "table 100") {
			s.routes = append(s.routes, strings.TrimSpace(l))
		}
	}
	return s
}

func wantInstalled(t *testing.T, ns *nstest.Netns, family string) {
	t.Helper()
	s := observeRouting(t, ns, family)
	if len(s.rules) != 1 || !strings.HasPrefix(s.rules[0], "32764:") || !strings.Contains(s.rules[0], "from all fwmark 0x111/0xfff lookup 100") {
		t.Errorf("ip %s rule: got %q, want exactly one `32764: from all fwmark 0x111/0xfff lookup 100`", family, s.rules)
	}
	if len(s.routes) != 1 || !strings.HasPrefix(s.routes[0], "local default dev lo table 100") {
		t.Errorf("ip %s route table 100: got %q, want exactly `local default dev lo table 100 ...`", family, s.routes)
	}
}

func wantNone(t *testing.T, ns *nstest.Netns, family string) {
	t.Helper()
	s := observeRouting(t, ns, family)
	if len(s.rules) != 0 || len(s.routes) != 0 {
		t.Errorf("ip %s: rules %q, table 100 routes %q; want none", family, s.rules, s.routes)
	}
}

func openNetns(t *testing.T, ns *nstest.Netns) *netns.Handle {
	t.Helper()
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func inspect(t *testing.T, h *netns.Handle) netns.RoutingState {
	t.Helper()
	st, err := netns.InspectRouting(h, netns.DefaultRouting())
	if err != nil {
		t.Fatalf("InspectRouting: %v", err)
	}
	return st
}

func TestRoutingIdempotent(t *testing.T) {
	if !nstest.HaveIPv6() {
		t.Skip("kernel without IPv6")
	}
	ns := nstest.NewNetns(t)
	h := openNetns(t, ns)
	r := netns.DefaultRouting()
	wantNone(t, ns, "-4")
	wantNone(t, ns, "-6")
	if st := inspect(t, h); !st.Absent() || !st.V6Capable {
		t.Errorf("before: %+v, want absent and IPv6-capable", st)
	}
	for i := range 2 {
		if _, err := netns.EnsureRouting(h, r); err != nil {
			t.Fatalf("EnsureRouting #%d: %v", i+1, err)
		}
		wantInstalled(t, ns, "-4")
		wantInstalled(t, ns, "-6")
		if st := inspect(t, h); !st.Complete() {
			t.Errorf("after EnsureRouting #%d: %+v, want complete", i+1, st)
		}
	}
	for i := range 2 {
		if err := netns.RemoveRouting(h, r); err != nil {
			t.Fatalf("RemoveRouting #%d: %v", i+1, err)
		}
		wantNone(t, ns, "-4")
		wantNone(t, ns, "-6")
		if st := inspect(t, h); !st.Absent() {
			t.Errorf("after RemoveRouting #%d: %+v, want absent", i+1, st)
		}
	}
}

// TestRoutingRepairsPartial: EnsureRouting completes a half-present setup
// (one family's rule deleted by hand) without duplicating the rest.
func TestRoutingRepairsPartial(t *testing.T) {
	if !nstest.HaveIPv6() {
		t.Skip("kernel without IPv6")
	}
	ns := nstest.NewNetns(t)
	h := openNetns(t, ns)
	r := netns.DefaultRouting()
	if _, err := netns.EnsureRouting(h, r); err != nil {
		t.Fatal(err)
	}
	ns.IP(t, "-6", "rule", "del", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100")
	ns.IP(t, "-4", "route", "del", "local", "default", "dev", "lo", "table", "100")
	if st := inspect(t, h); st.Complete() || st.V6Rule || st.V4Route || !st.V4Rule || !st.V6Route {
		t.Errorf("after deleting the v6 rule and v4 route: %+v", st)
	}
	if _, err := netns.EnsureRouting(h, r); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, ns, "-4")
	wantInstalled(t, ns, "-6")
}

// TestRoutingWithoutIPv6: a namespace whose loopback has IPv6 disabled
// gets IPv4 routing only, and that counts as complete.
func TestRoutingWithoutIPv6(t *testing.T) {
	ns := nstest.NewNetns(t)
	if nstest.HaveIPv6() {
		ns.Run(t, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/lo/disable_ipv6")
	}
	h := openNetns(t, ns)
	r := netns.DefaultRouting()
	if _, err := netns.EnsureRouting(h, r); err != nil {
		t.Fatalf("EnsureRouting: %v", err)
	}
	wantInstalled(t, ns, "-4")
	if nstest.HaveIPv6() {
		wantNone(t, ns, "-6")
	}
	st := inspect(t, h)
	if st.V6Capable || !st.Complete() {
		t.Errorf("state %+v, want complete without IPv6", st)
	}
	for i := range 2 {
		if err := netns.RemoveRouting(h, r); err != nil {
			t.Fatalf("RemoveRouting #%d: %v", i+1, err)
		}
	}
	wantNone(t, ns, "-4")
	if st := inspect(t, h); !st.Absent() {
		t.Errorf("after RemoveRouting: %+v, want absent", st)
	}
}

// TestRoutingLoopbackDown: `ip netns add` leaves lo down, and a down lo
// has no ::1. EnsureRouting brings lo up; the namespace then has IPv6, so
// the result must be complete for both families.
func TestRoutingLoopbackDown(t *testing.T) {
	if !nstest.HaveIPv6() {
		t.Skip("kernel without IPv6")
	}
	ns := nstest.NewNetns(t)
	ns.IP(t, "link", "set", "lo", "down")
	h := openNetns(t, ns)
	if _, err := netns.EnsureRouting(h, netns.DefaultRouting()); err != nil {
		t.Fatalf("EnsureRouting: %v", err)
	}
	if out := ns.IP(t, "link", "show", "lo"); !strings.Contains(out, ",UP") {
		t.Errorf("lo still down after EnsureRouting: %s", out)
	}
	wantInstalled(t, ns, "-4")
	wantInstalled(t, ns, "-6")
	if st := inspect(t, h); !st.Complete() {
		t.Errorf("InspectRouting right after EnsureRouting: %+v, want complete", st)
	}
}

func TestRoutingValidate(t *testing.T) {
	nstest.RequirePrivileged(t)
	ns := nstest.NewNetns(t)
	h := openNetns(t, ns)
	for _, r := range []netns.Routing{
		{Mark: 0x111, Mask: 0, Table: 100, Priority: 32764},
		{Mark: 0x1111, Mask: 0xfff, Table: 100, Priority: 32764},
		{Mark: 0x111, Mask: 0xfff, Table: 254, Priority: 32764},
		{Mark: 0x111, Mask: 0xfff, Table: 100, Priority: 32766},
	} {
		if _, err := netns.EnsureRouting(h, r); err == nil {
			t.Errorf("EnsureRouting(%+v) succeeded, want a validation error", r)
		}
	}
	wantNone(t, ns, "-4")
}

// TestRoutingReleaseWhateverThePodDid: a pod owns its namespace and may
// do anything to it after enrolment; RemoveRouting must still release it,
// and leave what is not ours.
func TestRoutingReleaseWhateverThePodDid(t *testing.T) {
	if !nstest.HaveIPv6() {
		t.Skip("kernel without IPv6")
	}
	for _, tc := range []struct {
		name string
		// what the pod does after EnsureRouting
		lines []string
		// lines that must survive the release
		keep []string
	}{
		{name: "renamed lo", lines: []string{"link set lo down", "link set lo name podlo", "link set podlo up"}},
		{name: "lo down", lines: []string{"link set lo down"}},
		{name: "rule and route already deleted", lines: []string{
			"-4 rule del fwmark 0x111/0xfff pref 32764 lookup 100",
			"-6 rule del fwmark 0x111/0xfff pref 32764 lookup 100",
			"-4 route del local default dev lo table 100",
			"-6 route del local default dev lo table 100",
		}},
		{name: "foreign rules at our priority", lines: []string{
			"-4 rule add pref 32764 fwmark 0x222/0xfff lookup 200",
			"-6 rule add pref 32764 lookup main",
		}, keep: []string{"fwmark 0x222/0xfff lookup 200", "32764:\tfrom all lookup main"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := nstest.NewNetns(t)
			h := openNetns(t, ns)
			r := netns.DefaultRouting()
			if _, err := netns.EnsureRouting(h, r); err != nil {
				t.Fatal(err)
			}
			for _, l := range tc.lines {
				ns.IP(t, strings.Fields(l)...)
			}
			if _, err := netns.InspectRouting(h, r); err != nil {
				t.Errorf("InspectRouting: %v", err)
			}
			for i := range 2 {
				if err := netns.RemoveRouting(h, r); err != nil {
					t.Fatalf("RemoveRouting #%d: %v", i+1, err)
				}
			}
			rules := ns.IP(t, "-4", "rule", "show") + ns.IP(t, "-6", "rule", "show")
			for _, l := range strings.Split(rules, "\n") {
				if strings.Contains(l, "fwmark 0x111/0xfff") {
					t.Errorf("our rule left: %q", l)
				}
			}
			routes := ns.IP(t, "-4", "route", "show", "table", "all") + ns.IP(t, "-6", "route", "show", "table", "all")
			if strings.Contains(routes, "table 100") {
				t.Errorf("our route left:\n%s", routes)
			}
			for _, k := range tc.keep {
				if !strings.Contains(rules, k) {
					t.Errorf("the pod's rule %q was removed:\n%s", k, rules)
				}
			}
			if st := inspect(t, h); !st.Absent() {
				t.Errorf("after RemoveRouting: %+v, want absent", st)
			}
		})
	}
}

// TestRoutingWithRenamedLoopback: a pod may rename lo before enrolment.
func TestRoutingWithRenamedLoopback(t *testing.T) {
	if !nstest.HaveIPv6() {
		t.Skip("kernel without IPv6")
	}
	ns := nstest.NewNetns(t)
	ns.IPBatch(t, "link set lo name podlo", "link set podlo up")
	h := openNetns(t, ns)
	if _, err := netns.EnsureRouting(h, netns.DefaultRouting()); err != nil {
		t.Fatalf("EnsureRouting: %v", err)
	}
	if st := inspect(t, h); !st.Complete() {
		t.Errorf("InspectRouting: %+v, want complete", st)
	}
}

// TestRoutingRefusesClosedHandle: a closed handle has no namespace left;
// routing work on it must fail, not fall back to the caller's own
// namespace (vishvananda/netlink treats fd -1 as "the current one").
// Only reads are tried, so a failure cannot touch the test's namespace.
func TestRoutingRefusesClosedHandle(t *testing.T) {
	h := openNetns(t, nstest.NewNetns(t))
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := netns.InspectRouting(h, netns.DefaultRouting()); err == nil {
		t.Errorf("InspectRouting on a closed handle = %+v, nil; want an error", st)
	}
}

// TestRemoveAddedUndoesOneCall: RemoveAdded takes out exactly what one
// EnsureRouting created. In a namespace with lo down and nothing else, that
// is everything, lo going down again included; beside the same routing
// installed first by someone else (istio-cni's is byte-equal to ours),
// nothing; after half of it was deleted, the half it put back.
func TestRemoveAddedUndoesOneCall(t *testing.T) {
	if !nstest.HaveIPv6() {
		t.Skip("kernel without IPv6")
	}
	r := netns.DefaultRouting()
	snapshot := func(ns *nstest.Netns) string {
		var b strings.Builder
		for _, fam := range []string{"-4", "-6"} {
			b.WriteString(ns.IP(t, fam, "rule", "show"))
			b.WriteString(ns.IP(t, fam, "route", "show", "table", "all"))
		}
		b.WriteString(ns.IP(t, "link", "show", "lo"))
		return b.String()
	}
	ensure := func(h *netns.Handle) netns.Added {
		t.Helper()
		a, err := netns.EnsureRouting(h, r)
		if err != nil {
			t.Fatalf("EnsureRouting: %v", err)
		}
		return a
	}
	undo := func(h *netns.Handle, a netns.Added) {
		t.Helper()
		if err := netns.RemoveAdded(h, a); err != nil {
			t.Fatalf("RemoveAdded: %v", err)
		}
	}

	t.Run("empty namespace", func(t *testing.T) {
		ns := nstest.NewNetns(t)
		ns.IP(t, "link", "set", "lo", "down")
		h := openNetns(t, ns)
		before := snapshot(ns)
		a := ensure(h)
		if want := (netns.Added{Routing: r, V4Rule: true, V4Route: true, V6Rule: true, V6Route: true, LoopbackUp: true}); a != want {
			t.Errorf("Added = %+v; want %+v", a, want)
		}
		undo(h, a)
		if after := snapshot(ns); after != before {
			t.Errorf("not as before\n--- before\n%s\n--- after\n%s", before, after)
		}
	})
	t.Run("routing that was there", func(t *testing.T) {
		ns := nstest.NewNetns(t)
		for _, fam := range []string{"-4", "-6"} {
			ns.IP(t, fam, "route", "add", "local", "default", "dev", "lo", "table", "100")
			ns.IP(t, fam, "rule", "add", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100")
		}
		h := openNetns(t, ns)
		before := snapshot(ns)
		a := ensure(h)
		if !a.Empty() {
			t.Errorf("Added = %+v; want nothing", a)
		}
		undo(h, a)
		if after := snapshot(ns); after != before {
			t.Errorf("not as before\n--- before\n%s\n--- after\n%s", before, after)
		}
	})
	t.Run("half of it deleted", func(t *testing.T) {
		ns := nstest.NewNetns(t)
		h := openNetns(t, ns)
		ensure(h)
		ns.IP(t, "-6", "rule", "del", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100")
		ns.IP(t, "-4", "route", "del", "local", "default", "dev", "lo", "table", "100")
		before := snapshot(ns)
		a := ensure(h)
		if want := (netns.Added{Routing: r, V4Route: true, V6Rule: true}); a != want {
			t.Errorf("Added = %+v; want %+v", a, want)
		}
		undo(h, a)
		if after := snapshot(ns); after != before {
			t.Errorf("not as before\n--- before\n%s\n--- after\n%s", before, after)
		}
	})
}
