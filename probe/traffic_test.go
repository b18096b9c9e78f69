package probe_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/probe"
)

// Environment of the dialling child: the test binary re-executed under
// another uid, because the SNAT rule matches the socket owner.
const (
	childDialEnv  = "NFTREDIR_PROBE_TEST_DIAL"
	childTokenEnv = "NFTREDIR_PROBE_TEST_TOKEN"
)

func TestMain(m *testing.M) {
	if to := os.Getenv(childDialEnv); to != "" {
		os.Exit(childDial(to, os.Getenv(childTokenEnv)))
	}
	os.Exit(m.Run())
}

// childDial speaks the nstest listener protocol: a token line out, the
// listener's name back.
func childDial(to, token string) int {
	c, err := net.DialTimeout("tcp", to, nstest.DefaultTimeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(nstest.DefaultTimeout))
	if _, err := io.WriteString(c, token+"\n"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(line)
	return 0
}

// childBinary copies the test binary where any uid can execute it: the
// build directory is private to root.
func childBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nftredir-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dial")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// dialAs connects from inside ns as uid and returns the record of the
// listener that answered. The child is forked from a thread inside ns, so
// it starts there; it never has the privileges to move.
func dialAs(t *testing.T, bin string, ns *nstest.Netns, rec *nstest.Recorder, uid uint32, to netip.AddrPort) nstest.Record {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	token := hex.EncodeToString(b)
	var out []byte
	err := ns.Do(func() error {
		cmd := exec.Command(bin)
		cmd.Env = []string{childDialEnv + "=" + to.String(), childTokenEnv + "=" + token}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			return fmt.Errorf("%w: %s", err, stderr.String())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dial %s as uid %d from %s: %v", to, uid, ns.Name, err)
	}
	r, ok := rec.Lookup(token)
	if !ok || r.Listener != strings.TrimSpace(string(out)) {
		t.Fatalf("dial %s as uid %d: reply %q has no matching record (%v)", to, uid, out, r)
	}
	return r
}

// capturePod programs the pod's capture the way the daemon does: policy
// routing, then the nft table.
func capturePod(t *testing.T, pod *nstest.Netns, uid string) {
	t.Helper()
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(pod.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.EnsureRouting(h, netns.DefaultRouting()); err != nil {
		t.Fatal(err)
	}
	rs, err := nft.Build(nft.DefaultSpec(uid))
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
		t.Fatal(err)
	}
}

// TestProbeTraffic sends real TCP from the node namespace to a captured
// pod: the kubelet's connections arrive at the app from the probe source,
// everyone else's are captured by the proxy with the node's address.
func TestProbeTraffic(t *testing.T) {
	const kubelet, other = 4242, 4343
	pair := nstest.NewPair(t)
	node, pod := pair.Peer, pair.Pod
	rec := nstest.NewRecorder()
	nstest.StartProxy(t, pod, rec, nstest.DefaultProxyPorts)
	nstest.StartTCP(t, pod, rec, "app", 8080)
	capturePod(t, pod, podA)
	bin := childBinary(t)

	m, err := probe.New(probe.Config{NetnsPath: node.Path, KubeletUID: kubelet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	families := []bool{false}
	if nstest.HaveIPv6() {
		families = append(families, true)
	}
	podAddrs := []netip.Addr{nstest.V4.Pod}
	if nstest.HaveIPv6() {
		podAddrs = append(podAddrs, nstest.V6.Pod)
	}

	captured := func(t *testing.T, r nstest.Record, a nstest.Addrs) {
		t.Helper()
		if r.Listener != nstest.ProxyInbound || r.Remote.Addr() != a.Peer || r.Local != netip.AddrPortFrom(a.Pod, 8080) {
			t.Errorf("got %v; want captured by %s from the node address %s", r, nstest.ProxyInbound, a.Peer)
		}
	}
	for _, v6 := range families {
		a := nstest.Family(v6)
		to := netip.AddrPortFrom(a.Pod, 8080)
		t.Run(fmt.Sprintf("ipv6=%v", v6), func(t *testing.T) {
			// Not enrolled in the node table yet: even the kubelet's
			// connection is captured.
			captured(t, dialAs(t, bin, node, rec, kubelet, to), a)

			if err := m.Add(ctx, podA, podAddrs); err != nil {
				t.Fatal(err)
			}
			r := dialAs(t, bin, node, rec, kubelet, to)
			if r.Listener != "app" || r.Remote.Addr() != a.Probe {
				t.Errorf("kubelet's connection: got %v; want the app, from the probe source %s", r, a.Probe)
			}
			captured(t, dialAs(t, bin, node, rec, other, to), a)
			// Root is not the kubelet here either.
			r, err := node.Exchange(rec, nstest.Dial{Network: "tcp", To: to})
			if err != nil {
				t.Fatal(err)
			}
			captured(t, r, a)

			if err := m.Remove(ctx, podA); err != nil {
				t.Fatal(err)
			}
			captured(t, dialAs(t, bin, node, rec, kubelet, to), a)
		})
	}
}
