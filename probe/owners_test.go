package probe

import (
	"maps"
	"net/netip"
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
