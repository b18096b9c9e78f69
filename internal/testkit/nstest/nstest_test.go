package nstest_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestPairCarriesTraffic checks the fixture itself, with no rules of ours:
// both directions deliver directly, for both families, and Do leaves the
// test's own namespace as it was.
func TestPairCarriesTraffic(t *testing.T) {
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	p := nstest.NewPair(t)
	rec := nstest.NewRecorder()
	nstest.StartTCP(t, p.Pod, rec, "app", 8080)
	nstest.StartTCP(t, p.Peer, rec, "server", 9090)
	for _, v6 := range []bool{false, true} {
		if v6 && !nstest.HaveIPv6() {
			continue
		}
		a := nstest.Family(v6)
		tcp := "tcp4"
		if v6 {
			tcp = "tcp6"
		}
		r, err := p.Peer.Exchange(rec, nstest.Dial{Network: tcp, To: netip.AddrPortFrom(a.Pod, 8080)})
		if err != nil || r.Listener != "app" || r.Local != netip.AddrPortFrom(a.Pod, 8080) || r.Remote.Addr() != a.Peer {
			t.Errorf("peer -> pod: %v, %v", r, err)
		}
		r, err = p.Pod.Exchange(rec, nstest.Dial{Network: tcp, To: netip.AddrPortFrom(a.Extra, 9090)})
		if err != nil || r.Listener != "server" || r.Remote.Addr() != a.Pod {
			t.Errorf("pod -> peer extra address: %v, %v", r, err)
		}
		r, err = p.Peer.Exchange(rec, nstest.Dial{Network: tcp, From: netip.AddrPortFrom(a.Probe, 0), To: netip.AddrPortFrom(a.Pod, 8080)})
		if err != nil || r.Listener != "app" || r.Remote.Addr() != a.Probe {
			t.Errorf("peer from probe address -> pod: %v, %v", r, err)
		}
		if _, err := p.Peer.Exchange(rec, nstest.Dial{Network: tcp, To: netip.AddrPortFrom(a.Routed, 8080), Timeout: 300 * time.Millisecond}); err == nil {
			t.Errorf("peer -> %s reached a listener without any capture", a.Routed)
		}
	}
	// Do must leave no thread of the process behind in a test namespace.
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if ns, err := os.Readlink(task); err == nil && ns != own {
			t.Errorf("%s is %s, want the process's own %s", task, ns, own)
		}
	}
}
