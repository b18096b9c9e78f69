package pins_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/netns/pins"
)

// pin bind-mounts the namespace file src at dir/name, as a runtime pins a
// sandbox's namespace, and unmounts it when the test ends.
func pin(t testing.TB, src, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", src, p).CombinedOutput(); err != nil {
		t.Fatalf("mount --bind %s %s: %v: %s", src, p, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", p).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", p, err, out)
		}
	})
	return p
}

// podNetns is a namespace whose eth0 (one end of a veth pair) carries addrs, as a pod's
// namespace carries its IPs.
func podNetns(t testing.TB, addrs ...string) *nstest.Netns {
	t.Helper()
	ns := nstest.NewNetns(t)
	lines := []string{"link add eth0 type veth peer name peer0", "link set eth0 up", "link set peer0 up"}
	for _, a := range addrs {
		lines = append(lines, "addr add "+a+" dev eth0 nodad")
	}
	ns.IPBatch(t, lines...)
	return ns
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func newScanner(t *testing.T, dirs ...string) *pins.Scanner {
	t.Helper()
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	s, err := pins.New(pins.Config{Guard: g, Dirs: dirs})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func scan(t *testing.T, s *pins.Scanner) *pins.Scan {
	t.Helper()
	sc, err := s.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// idOf is the identity the daemon's guard reads from path.
func idOf(t *testing.T, path string) netns.ID {
	t.Helper()
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return h.ID()
}

func TestFindProvesThePodsNamespace(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	pod := podNetns(t, "10.77.0.5/24", "fd00:77::5/64")
	podPin := pin(t, pod.Path, dir, "cni-pod")
	// Decoys: a namespace with no address, one with another pod's, one
	// whose loopback carries the pod's IP (anyone inside may put any
	// address on lo), the node's own namespace pinned, a symlink to the
	// pod's namespace, and the empty file a dead sandbox's pin leaves.
	pin(t, nstest.NewNetns(t).Path, dir, "cni-empty")
	pin(t, podNetns(t, "10.77.0.6/24").Path, dir, "cni-other")
	onLo := nstest.NewNetns(t)
	onLo.IP(t, "addr", "add", "10.77.0.5/32", "dev", "lo")
	pin(t, onLo.Path, dir, "cni-lo")
	pin(t, "/proc/self/ns/net", dir, "cni-node")
	if err := os.Symlink(pod.Path, filepath.Join(dir, "cni-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cni-dead"), nil, 0o444); err != nil {
		t.Fatal(err)
	}

	sc := scan(t, newScanner(t, dir, filepath.Join(dir, "missing")))
	t.Logf("scan of %d pins took %s; skipped %v", len(sc.Pins), sc.Took, sc.Skipped)
	if len(sc.Pins) != 4 {
		t.Errorf("scan opened %d namespaces, want 4 (pod, empty, other, lo): %+v", len(sc.Pins), sc.Pins)
	}
	for name, why := range map[string]string{
		"cni-node": netns.ErrHostNetns.Error(),
		"cni-link": "not a regular file",
		"cni-dead": netns.ErrNotNetns.Error(),
	} {
		if got := sc.Skipped[filepath.Join(dir, name)]; !strings.Contains(got, why) {
			t.Errorf("%s skipped because %q, want %q", name, got, why)
		}
	}

	want := idOf(t, pod.Path)
	for _, ips := range [][]netip.Addr{addrs("10.77.0.5"), addrs("fd00:77::5"), addrs("10.77.0.5", "fd00:77::5")} {
		got, err := sc.Find(ips)
		if err != nil {
			t.Fatalf("Find(%v): %v", ips, err)
		}
		if got.Path != podPin || got.ID != want || got.ID.Cookie == 0 {
			t.Errorf("Find(%v) = %s %s, want %s %s (cookie read)", ips, got.Path, got.ID, podPin, want)
		}
	}
	if _, err := sc.Find(nil); !errors.Is(err, pins.ErrNoPodIP) {
		t.Errorf("Find(no IPs) = %v, want ErrNoPodIP", err)
	}
	if _, err := sc.Find(addrs("10.77.0.9")); !errors.Is(err, pins.ErrNotFound) {
		t.Errorf("Find(an IP nobody has) = %v, want ErrNotFound", err)
	}
}

func TestFindRefusesTwoNamespacesWithThePodsIP(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	pin(t, podNetns(t, "10.77.0.5/24").Path, dir, "cni-pod")
	pin(t, podNetns(t, "10.77.0.5/24").Path, dir, "cni-twin")
	// A pod whose v4 and v6 addresses are in two namespaces is refused too.
	pin(t, podNetns(t, "fd00:77::5/64").Path, dir, "cni-v6")

	sc := scan(t, newScanner(t, dir))
	for _, ips := range [][]netip.Addr{addrs("10.77.0.5"), addrs("fd00:77::5", "10.77.0.5")} {
		_, err := sc.Find(ips)
		if !errors.Is(err, pins.ErrAmbiguous) || !strings.Contains(err.Error(), "cni-pod") || !strings.Contains(err.Error(), "cni-twin") {
			t.Errorf("Find(%v) = %v, want ErrAmbiguous naming both pins", ips, err)
		}
	}
}

func TestFindTakesTwoPinsOfOneNamespaceAsOne(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir, docker := t.TempDir(), t.TempDir()
	pod := podNetns(t, "10.77.0.5/24")
	first := pin(t, pod.Path, dir, "cni-pod")
	second := pin(t, pod.Path, docker, "0123abcd")

	sc := scan(t, newScanner(t, dir, docker))
	got, err := sc.Find(addrs("10.77.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Pins) != 1 || len(got.Aliases) != 1 || got.Path != min(first, second) || got.Aliases[0] != max(first, second) {
		t.Errorf("got %+v of %d pins; want one namespace pinned at %s and %s", got, len(sc.Pins), first, second)
	}
}

func TestFindRefusesTheNodesNamespace(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	// The test must not touch the machine's namespace, so a namespace
	// carrying the pod's IP stands in for the node's: the guard protects
	// it as the daemon's guard protects --node-netns.
	node := podNetns(t, "10.77.0.5/24")
	pin(t, node.Path, dir, "cni-node")
	g, err := netns.NewGuard(node.Path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pins.New(pins.Config{Guard: g, Dirs: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	sc := scan(t, s)
	if _, err := sc.Find(addrs("10.77.0.5")); !errors.Is(err, pins.ErrNotFound) {
		t.Errorf("Find of an IP only the node's namespace carries = %v, want ErrNotFound", err)
	}
	if why := sc.Skipped[filepath.Join(dir, "cni-node")]; !strings.Contains(why, netns.ErrHostNetns.Error()) {
		t.Errorf("node's pin skipped because %q", why)
	}
}

func TestRecentSharesOneScan(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	s := newScanner(t, dir)
	first, err := s.Recent(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pin(t, podNetns(t, "10.77.0.5/24").Path, dir, "cni-new")
	again, err := s.Recent(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Error("a scan younger than maxAge was not reused")
	}
	fresh, err := s.Recent(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Find(addrs("10.77.0.5")); err != nil {
		t.Errorf("a fresh scan does not see the new pin: %v", err)
	}
}

// TestScanTiming measures a scan over as many pins as a node runs pods
// (kubelet's default maxPods is 110), for the README's figure.
func TestScanTiming(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	const n = 110
	start := time.Now()
	for i := range n {
		pin(t, podNetns(t, fmt.Sprintf("10.78.%d.%d/16", i/250, i%250+2)).Path, dir, fmt.Sprintf("cni-%03d", i))
	}
	t.Logf("made %d pinned namespaces in %s", n, time.Since(start).Round(time.Millisecond))
	s := newScanner(t, dir)
	var took []time.Duration
	for range 5 {
		sc := scan(t, s)
		if len(sc.Pins) != n {
			t.Fatalf("scan found %d namespaces, want %d; skipped %v", len(sc.Pins), n, sc.Skipped)
		}
		if _, err := sc.Find(addrs("10.78.0.77")); err != nil {
			t.Fatal(err)
		}
		took = append(took, sc.Took)
	}
	t.Logf("scan of %d pins: %v (%.0f µs per pin, best run)", n, took, float64(slices.Min(took).Microseconds())/n)
	if m := slices.Min(took); m > 5*time.Second {
		t.Errorf("a scan of %d pins takes %s", n, m)
	}
}

// TestFindRefusesWhileAPinCannotBeRead: a pin that cannot be read (here
// one on a mount that never answers) may be a second namespace carrying
// the pod's IP, so the one namespace found is not proven the pod's: Find
// refuses, naming the pin, until every pin reads.
func TestFindRefusesWhileAPinCannotBeRead(t *testing.T) {
	dir := t.TempDir()
	pod := podNetns(t, "10.80.0.5/24")
	pin(t, pod.Path, dir, "cni-pod")
	hung := filepath.Join(dir, "cni-hung")
	if err := os.WriteFile(hung, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	abort := nstest.HungFile(t, hung)
	g, err := netns.NewGuardConfig(netns.GuardConfig{OpenTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pins.New(pins.Config{Guard: g, Dirs: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	sc := scan(t, s)
	if _, ok := sc.Unreadable[hung]; !ok {
		t.Fatalf("the hung pin is not listed unreadable: %v (skipped %v)", sc.Unreadable, sc.Skipped)
	}
	for _, ips := range [][]netip.Addr{addrs("10.80.0.5"), addrs("10.80.0.9")} {
		p, err := sc.Find(ips)
		if !errors.Is(err, pins.ErrIncomplete) || !strings.Contains(err.Error(), hung) {
			t.Errorf("Find(%v) = %v, %v; want %v naming %s", ips, p.Path, err, pins.ErrIncomplete, hung)
		}
	}
	// Once the mount answers (here: fails at once), the pin is a certain
	// non-candidate no more than before: it is still unreadable.
	abort()
	sc = scan(t, s)
	if _, err := sc.Find(addrs("10.80.0.5")); !errors.Is(err, pins.ErrIncomplete) {
		t.Errorf("with the mount failing: %v; want %v", err, pins.ErrIncomplete)
	}
}
