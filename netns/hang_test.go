package netns_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
)

// openWithin calls Open and fails the test if it does not return within
// limit: on a guard without a bound it would hang the test forever (the
// hung mount's cleanup then releases it).
func openWithin(t *testing.T, g *netns.Guard, path string, limit time.Duration) (*netns.Handle, time.Duration, error) {
	t.Helper()
	type result struct {
		h   *netns.Handle
		err error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		h, err := g.Open(path)
		res <- result{h, err}
	}()
	select {
	case r := <-res:
		if r.h != nil {
			t.Cleanup(func() { r.h.Close() })
		}
		return r.h, time.Since(start), r.err
	case <-time.After(limit):
		t.Fatalf("Open(%s) still blocked after %s", path, limit)
		return nil, 0, nil
	}
}

// TestOpenOnAHungMountIsBounded: a path on a mount that never answers
// (a real FUSE mount whose server never replies) fails with ErrTimeout
// in bounded time, retries of it take no more threads, and only
// MaxPendingOpens opens are ever stuck at once.
func TestOpenOnAHungMountIsBounded(t *testing.T) {
	hung, abort := nstest.HungMount(t)
	ns := nstest.NewNetns(t)
	const timeout = 300 * time.Millisecond
	g, err := netns.NewGuardConfig(netns.GuardConfig{OpenTimeout: timeout, MaxPendingOpens: 2})
	if err != nil {
		t.Fatal(err)
	}
	x, y := filepath.Join(hung, "x"), filepath.Join(hung, "y")
	for i := range 3 {
		// The first takes a slot and stays in the kernel; the retries
		// wait for it rather than taking more.
		if _, d, err := openWithin(t, g, x, 5*time.Second); !errors.Is(err, netns.ErrTimeout) || d > 3*timeout {
			t.Fatalf("Open on a hung mount #%d: %v after %s; want ErrTimeout after about %s", i+1, err, d, timeout)
		}
	}
	if _, _, err := openWithin(t, g, ns.Path, 5*time.Second); err != nil {
		t.Fatalf("Open of a real namespace with one open stuck: %v", err)
	}
	if _, _, err := openWithin(t, g, y, 5*time.Second); !errors.Is(err, netns.ErrTimeout) {
		t.Fatalf("Open of a second hung path: %v; want ErrTimeout", err)
	}
	// Both slots are stuck now: the bound holds, and says so.
	if _, _, err := openWithin(t, g, ns.Path, 5*time.Second); !errors.Is(err, netns.ErrTimeout) {
		t.Fatalf("Open with every slot stuck: %v; want ErrTimeout", err)
	}
	// Once the mount dies the stuck opens finish and free their slots.
	abort()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := openWithin(t, g, ns.Path, 5*time.Second)
		if err == nil {
			h.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Open after the hung mount died: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := openWithin(t, g, x, 5*time.Second); err == nil || errors.Is(err, netns.ErrTimeout) {
		t.Errorf("Open on the dead mount: %v; want its own error, at once", err)
	}
}

// TestOpenDefaultGuardIsBounded: NewGuard, which the daemon uses, has
// the bound too.
func TestOpenDefaultGuardIsBounded(t *testing.T) {
	hung, _ := nstest.HungMount(t)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := openWithin(t, g, filepath.Join(hung, "x"), 3*netns.DefaultOpenTimeout); !errors.Is(err, netns.ErrTimeout) {
		t.Fatalf("Open on a hung mount: %v; want ErrTimeout", err)
	}
}
