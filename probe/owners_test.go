package probe

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
)

var (
	ipA = netip.MustParseAddr("10.0.0.1")
	ipB = netip.MustParseAddr("10.0.0.2")
	ip6 = netip.MustParseAddr("fd00::1")
)

func TestIntentAddTakesOverReusedAddress(t *testing.T) {
	in := newIntent()
	in.set("old", []netip.Addr{ipA})
	in.set("new", []netip.Addr{ipA})
	got := in.afterAdd(map[netip.Addr]string{ipA: "old"}, "new")
	if want := (changes{ipA: "new"}); !maps.Equal(got, want) {
		t.Errorf("afterAdd = %v, want %v", got, want)
	}
}

func TestIntentRemoveLeavesOthersElements(t *testing.T) {
	in := newIntent()
	in.set("old", []netip.Addr{ipA})
	in.set("new", []netip.Addr{ipA})
	in.remove("old")
	// The element belongs to "new": releasing "old" must not touch it.
	if got := in.afterRemove(map[netip.Addr]string{ipA: "new"}, "old"); len(got) != 0 {
		t.Errorf("afterRemove(old) = %v, want no change", got)
	}
}

func TestIntentRemoveHandsOverToRemainingClaimant(t *testing.T) {
	in := newIntent()
	in.set("old", []netip.Addr{ipA})
	in.set("new", []netip.Addr{ipA, ipB})
	in.remove("new")
	got := in.afterRemove(map[netip.Addr]string{ipA: "new", ipB: "new"}, "new")
	if want := (changes{ipA: "old", ipB: ""}); !maps.Equal(got, want) {
		t.Errorf("afterRemove(new) = %v, want %v", got, want)
	}
}

func TestIntentReAddReleasesDroppedAddress(t *testing.T) {
	in := newIntent()
	in.set("pod", []netip.Addr{ipB})
	got := in.afterAdd(map[netip.Addr]string{ipA: "pod", ip6: "other"}, "pod")
	if want := (changes{ipA: "", ipB: "pod"}); !maps.Equal(got, want) {
		t.Errorf("afterAdd = %v, want %v", got, want)
	}
}

func TestIntentExact(t *testing.T) {
	in := newIntent()
	in.replace(map[string][]netip.Addr{"a": {ipA}, "b": {ipA, ip6}})
	live := map[netip.Addr]string{ipA: "a", ipB: "stranger"}
	got := in.exact(live)
	// a keeps ipA (it holds it and still claims it), the stranger goes,
	// ip6 is added for b.
	if want := (changes{ipA: "a", ipB: "", ip6: "b"}); !maps.Equal(got, want) {
		t.Errorf("exact = %v, want %v", got, want)
	}
	if got := in.seed(SetV4); !maps.Equal(got, map[netip.Addr]string{ipA: "b"}) {
		// No live owner: the later of a and b (ordered by uid when new).
		t.Errorf("seed(v4) = %v, want ipA owned by b", got)
	}
}

func TestIntentReplaceKeepsOrder(t *testing.T) {
	in := newIntent()
	in.set("z", []netip.Addr{ipA})
	in.set("a", []netip.Addr{ipA})
	in.replace(map[string][]netip.Addr{"z": {ipA}, "a": {ipA}})
	if got := in.winner([]string{"z", "a"}, ""); got != "a" {
		t.Errorf("winner after replace = %q, want a (added last before the reconcile)", got)
	}
}

// TestIntentIndexFollowsChanges: the claimant index kept by set, remove
// and replace is the one a full walk of the pods gives.
func TestIntentIndexFollowsChanges(t *testing.T) {
	walk := func(in *intent) map[netip.Addr][]string {
		idx := map[netip.Addr][]string{}
		for uid, c := range in.pods {
			for _, a := range c.addrs {
				idx[a] = append(idx[a], uid)
			}
		}
		return idx
	}
	same := func(a, b map[netip.Addr][]string) bool {
		return maps.EqualFunc(a, b, func(x, y []string) bool {
			return len(x) == len(y) && !slices.ContainsFunc(x, func(u string) bool { return !slices.Contains(y, u) })
		})
	}
	in := newIntent()
	steps := []func(){
		func() { in.set("a", []netip.Addr{ipA, ip6}) },
		func() { in.set("b", []netip.Addr{ipA}) },
		func() { in.set("a", []netip.Addr{ipB}) },
		func() { in.remove("b") },
		func() { in.remove("unknown") },
		func() { in.replace(map[string][]netip.Addr{"a": {ipA}, "c": {ipA, ipB}}) },
		func() { in.set("c", nil) },
	}
	for i, step := range steps {
		held := in.claimants()[ipA]
		heldCopy := slices.Clone(held)
		step()
		if got, want := in.claimants(), walk(in); !same(got, want) {
			t.Fatalf("step %d: index %v, want %v", i, got, want)
		}
		if !slices.Equal(held, heldCopy) {
			t.Errorf("step %d changed a claimant list handed out before it", i)
		}
	}
}
