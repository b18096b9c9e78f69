package probe_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/probe"
)

func TestMain(m *testing.M) {
	// TestProbeTraffic re-executes this binary as another uid to dial,
	// because the SNAT rule matches the socket's owner.
	if code, ok := nstest.RunDialChild(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
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
	if _, err := netns.EnsureRouting(h, netns.DefaultRouting()); err != nil {
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
	bin := nstest.DialChildBinary(t)

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
			captured(t, node.DialAs(t, bin, rec, kubelet, to), a)

			if err := m.Add(ctx, podA, podAddrs); err != nil {
				t.Fatal(err)
			}
			r := node.DialAs(t, bin, rec, kubelet, to)
			if r.Listener != "app" || r.Remote.Addr() != a.Probe {
				t.Errorf("kubelet's connection: got %v; want the app, from the probe source %s", r, a.Probe)
			}
			captured(t, node.DialAs(t, bin, rec, other, to), a)
			// Root is not the kubelet here either.
			r, err := node.Exchange(rec, nstest.Dial{Network: "tcp", To: to})
			if err != nil {
				t.Fatal(err)
			}
			captured(t, r, a)

			// The probe rule of this family counted the kubelet's SYN,
			// and counting is not drift.
			word := map[bool]string{false: "ip daddr", true: "ip6 daddr"}[v6]
			if !regexp.MustCompile(word + ` @pod-ips-v[46] counter packets [1-9][0-9]* bytes [1-9]`).MatchString(listTable(t, node)) {
				t.Errorf("the %s probe rule counted nothing:\n%s", word, listTable(t, node))
			}
			if p, err := m.Problems(ctx); err != nil || len(p) > 0 {
				t.Errorf("Problems with moved counters = %v, %v; want none", p, err)
			}

			if err := m.Remove(ctx, podA); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			captured(t, node.DialAs(t, bin, rec, kubelet, to), a)
		})
	}
}
