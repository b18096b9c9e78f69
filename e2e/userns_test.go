package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// TestUserNamespacePod: a pod with hostUsers: false has a network
// namespace owned by a child user namespace, where `meta skuid` resolves
// uids in that user namespace (istio#61173). The pod table matches marks
// only, never a uid, so capture must hold there unchanged: the table
// applies and verifies, the pod's TCP reaches the proxy, and the proxy's
// marked sockets pass uncaptured. (The node table's skuid match runs in
// the node's namespace, owned by the initial user namespace.)
func TestUserNamespacePod(t *testing.T) {
	nstest.RequirePrivileged(t)
	cmd := exec.Command("unshare", "--user", "--map-root-user", "--net", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare --user --net: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	nsPath := "/proc/" + itoa(cmd.Process.Pid) + "/ns/net"
	deadline := time.Now().Add(5 * time.Second)
	for {
		if l, err := os.Readlink(nsPath); err == nil && l != own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare did not make a network namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := make([]byte, 4)
	rand.Read(b)
	n := &nstest.Netns{Name: nstest.NamePrefix + "userns-" + hex.EncodeToString(b)}
	n.Path = "/run/netns/" + n.Name
	if out, err := exec.Command("ip", "netns", "attach", n.Name, itoa(cmd.Process.Pid)).CombinedOutput(); err != nil {
		t.Fatalf("ip netns attach: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.Name).Run() })

	// The namespace is owned by a user namespace other than the daemon's.
	fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	var ownerSt, initSt unix.Stat_t
	unix.Fstat(owner, &ownerSt)
	unix.Close(owner)
	if err := unix.Stat("/proc/self/ns/user", &initSt); err != nil {
		t.Fatal(err)
	}
	if ownerSt.Ino == initSt.Ino {
		t.Fatal("the namespace is owned by our own user namespace; the test needs a child one")
	}

	n.IPBatch(t, "link set lo up", "link add d0 type veth peer name d1", "addr add 10.96.7.2/24 dev d0", "link set d1 up", "link set d0 up", "route add default via 10.96.7.1")
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(n.Path)
	if err != nil {
		t.Fatalf("open a namespace owned by a child user namespace: %v", err)
	}
	defer h.Close()
	spec := nft.DefaultSpec("e2e-userns")
	rs, err := nft.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netns.EnsureRouting(h, netns.DefaultRouting()); err != nil {
		t.Fatal(err)
	}
	a := nft.NewNetlink()
	if err := a.Apply(t.Context(), h, rs); err != nil {
		t.Fatal(err)
	}
	if st, text, err := a.Verify(t.Context(), h, rs); err != nil || st != nft.StatusInSync {
		t.Fatalf("Verify: %s %v\n%s", st, err, text)
	}
	rec := nstest.NewRecorder()
	nstest.StartProxy(t, n, rec, nstest.DefaultProxyPorts)
	to := netip.MustParseAddrPort("10.96.7.1:9090")
	r, err := n.Exchange(rec, nstest.Dial{Network: "tcp4", To: to})
	if err != nil || r.Listener != nstest.ProxyOutbound || r.OrigDst != to {
		t.Errorf("the pod's connection to %s: %v %v; want the proxy's outbound listener with the original destination", to, r, err)
	}
	// The proxy's own socket goes out uncaptured: nobody answers on the
	// link.
	if r, err := n.Exchange(rec, nstest.Dial{Network: "tcp4", To: to, Sockopts: nstest.Sockopts{Mark: defaults.ProxyMark}, Timeout: 500 * time.Millisecond}); err == nil {
		t.Errorf("a proxy-marked connection was answered by %v; want it uncaptured", r)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
