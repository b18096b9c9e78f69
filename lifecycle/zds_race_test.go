package lifecycle_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/peercred"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/lifecycle"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

// TestZDSRaces runs what broke Istio's node agent, under the race
// detector in make race: a pod deleted while ztunnel reconnects
// deadlocked its ZDS server (istio#60786), and concurrent adds of
// IPv6-only pods panicked with concurrent map writes (istio#60328). Here
// a proxy reconnects in a loop (hanging up at every point of the
// snapshot, acking or not) while pods with IPv6 addresses only are added
// concurrently and half of them removed concurrently. Nothing may
// deadlock or panic, and afterwards a fresh connection's snapshot holds
// every enrolled pod exactly once and no removed one.
func TestZDSRaces(t *testing.T) {
	for _, requireAck := range []bool{false, true} {
		t.Run(fmt.Sprintf("requireAck=%v", requireAck), func(t *testing.T) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				zdsRaces(t, requireAck)
			}()
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				buf := make([]byte, 4<<20)
				t.Fatalf("deadlock: not done in 90s\n%s", buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

func zdsRaces(t *testing.T, requireAck bool) {
	const first, removed, later = 48, 24, 16
	store, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Error(err)
		return
	}
	fake := capturetest.NewFake()
	srv, err := zds.NewServer(zds.Config{
		Pods:           zds.StorePods{Store: store},
		Opener:         fake,
		AckTimeout:     time.Second,
		RetryBackoff:   5 * time.Millisecond,
		AcceptInterval: time.Millisecond,
		SocketGroup:    os.Getegid(),
		Allow:          peercred.Allowlist{UIDs: []uint32{uint32(os.Geteuid())}},
	})
	if err != nil {
		t.Error(err)
		return
	}
	sock := filepath.Join(t.TempDir(), "ztunnel.sock")
	if err := srv.Listen(sock); err != nil {
		t.Error(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() {
		srv.Close()
		cancel()
		<-served
	}()
	m, err := lifecycle.New(lifecycle.Config{Engine: fake, Store: store, ZDS: srv, ZDSRequireAck: requireAck})
	if err != nil {
		t.Error(err)
		return
	}

	// The proxy: connect, hello, take part of the snapshot or all of it
	// (acking, or leaving the last request unacked), hang up, again.
	stop := make(chan struct{})
	var reconnects atomic.Int64
	var proxy sync.WaitGroup
	proxy.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p, err := zdstest.Connect(t, sock)
			if err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			reconnects.Add(1)
			if p.Write(zdstest.HelloMsg(1)) == nil {
				for n := 0; n < i%(first+2); n++ {
					r, err := p.Recv(50 * time.Millisecond)
					if err != nil {
						break
					}
					zdstest.CloseFds(r)
					if n%7 == 6 || p.Write(zdstest.AckMsg("")) != nil {
						break
					}
				}
			}
			p.Close()
		}
	})

	var reqs []*nftredirv1.AddPodRequest
	pod := func(i int) *nftredirv1.AddPodRequest {
		path := fmt.Sprintf("/run/netns/race-%d", i)
		fake.AddNamespace(path)
		return &nftredirv1.AddPodRequest{
			PodUid: fmt.Sprintf("race-%03d", i), PodName: fmt.Sprintf("web-%d", i), PodNamespace: "v6only", NetnsPath: path,
			PodIps: []string{fmt.Sprintf("2600:1f14:abc:%x::%x", i, i+1)},
		}
	}
	var errs, lastOK sync.Map
	add := func(wg *sync.WaitGroup, i int) {
		req := reqs[i]
		wg.Go(func() {
			_, err := m.AddPod(ctx, req)
			lastOK.Store(req.GetPodUid(), err == nil)
			// Without the proxy's ack a new pod is left as it was, and
			// one enrolled before stays enrolled; that answer is the
			// contract, anything else is a failure.
			if err != nil && !(requireAck && lifecycle.Classify(err).Kind == lifecycle.KindUnavailable) {
				errs.Store(req.GetPodUid(), err)
			}
		})
	}
	// Rounds while the proxy churns: every pod added at once, then the
	// first ones removed while the rest are added again (or for the first
	// time), until the proxy has reconnected often enough during them.
	for i := range first + later {
		reqs = append(reqs, pod(i))
	}
	start, deadline := reconnects.Load(), time.Now().Add(30*time.Second)
	rounds := 0
	for ; rounds < 2 || reconnects.Load()-start < 40 && time.Now().Before(deadline); rounds++ {
		var wg sync.WaitGroup
		for i := range first {
			add(&wg, i)
		}
		wg.Wait()
		for i := range removed {
			uid := fmt.Sprintf("race-%03d", i)
			wg.Go(func() {
				if _, err := m.RemovePod(ctx, &nftredirv1.RemovePodRequest{PodUid: uid}); err != nil {
					errs.Store(uid, err)
				}
			})
		}
		for i := removed; i < first+later; i++ {
			add(&wg, i)
		}
		wg.Wait()
	}
	during := reconnects.Load() - start
	close(stop)
	proxy.Wait()
	errs.Range(func(k, v any) bool {
		t.Errorf("pod %v: %v", k, v)
		return true
	})

	// Every pod enrolled now is in the snapshot once; that is every pod
	// whose last AddPod succeeded, and under requireAck maybe one that an
	// earlier AddPod enrolled and whose last one waited in vain.
	want := map[string]bool{}
	recs, err := store.List()
	if err != nil {
		t.Error(err)
		return
	}
	for _, r := range recs {
		want[r.PodUID] = true
	}
	for i := range first + later {
		uid := fmt.Sprintf("race-%03d", i)
		if i < removed && want[uid] {
			t.Errorf("pod %s is enrolled after its RemovePod", uid)
		}
		if ok, _ := lastOK.Load(uid); i >= removed && ok == true && !want[uid] {
			t.Errorf("pod %s is not enrolled after its last AddPod succeeded", uid)
		}
	}
	if !requireAck && len(want) != first+later-removed {
		t.Errorf("records: %d; want %d", len(want), first+later-removed)
	}
	p, err := zdstest.Connect(t, sock)
	if err != nil {
		t.Error(err)
		return
	}
	if err := p.Write(zdstest.HelloMsg(1)); err != nil {
		t.Error(err)
		return
	}
	seen := map[string]int{}
	for {
		r, err := p.Recv(5 * time.Second)
		if err != nil {
			t.Errorf("final snapshot: %v", err)
			return
		}
		zdstest.CloseFds(r)
		if err := p.Write(zdstest.AckMsg("")); err != nil {
			t.Errorf("ack: %v", err)
			return
		}
		if r.Kind == zdstest.SnapshotSent {
			break
		}
		if r.Kind != zdstest.Add || len(r.Fds) != 1 {
			t.Errorf("final snapshot holds %v; want adds with one fd each", r)
		}
		seen[r.UID]++
	}
	for uid := range want {
		if seen[uid] != 1 {
			t.Errorf("final snapshot has %s %d times; want once", uid, seen[uid])
		}
	}
	for uid, n := range seen {
		if !want[uid] {
			t.Errorf("final snapshot has %s (%d times), which was removed or never added", uid, n)
		}
	}
	t.Logf("%d reconnects during %d rounds of %d adds and %d removes; final snapshot %d pods", during, rounds, first+later+(first-removed), removed, len(seen))
	if during < 10 {
		t.Errorf("the proxy reconnected %d times while pods were added and removed; the race was hardly run", during)
	}
}
