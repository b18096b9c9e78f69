package netns_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
)

func TestOpenPinFollowsNoSymlink(t *testing.T) {
	nstest.RequirePrivileged(t)
	ns := nstest.NewNetns(t)
	link := filepath.Join(t.TempDir(), "cni-link")
	if err := os.Symlink(ns.Path, link); err != nil {
		t.Fatal(err)
	}
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	if h, err := g.OpenPin(link); !errors.Is(err, netns.ErrNotNetns) {
		h.Close()
		t.Fatalf("OpenPin(a symlink to a namespace) = %v, want ErrNotNetns", err)
	}
	h, err := g.OpenPin(ns.Path)
	if err != nil {
		t.Fatalf("OpenPin(%s): %v", ns.Path, err)
	}
	h.Close()
	if h, err := g.OpenPin("/proc/self/ns/net"); err == nil {
		h.Close()
		t.Fatal("OpenPin of the daemon's own namespace succeeded")
	}
}

func TestInterfaceAddrsLeavesLoopbackOut(t *testing.T) {
	nstest.RequirePrivileged(t)
	ns := nstest.NewNetns(t)
	ns.IPBatch(t,
		"link add eth0 type veth peer name peer0",
		"link set eth0 up",
		"addr add 10.77.0.5/24 dev eth0",
		"addr add fd00:77::5/64 dev eth0 nodad",
		"addr add 10.77.1.1/32 dev lo",
	)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	got, err := netns.InterfaceAddrs(h)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	want := []netip.Addr{netip.MustParseAddr("10.77.0.5"), netip.MustParseAddr("fd00:77::5")}
	if !slices.Equal(got, want) {
		t.Errorf("InterfaceAddrs = %v, want %v (no lo, no link-local)", got, want)
	}
}
