package lifecycle

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// failAfter bounds a wait that must succeed; reaching it means a deadlock,
// not slowness, so it is generous.
const failAfter = 10 * time.Second

func TestPodLocksSerialiseOneKey(t *testing.T) {
	l := newPodLocks()
	ctx := context.Background()
	unlockA, err := l.lock(ctx, "pod")
	if err != nil {
		t.Fatal(err)
	}
	acquired := make(chan func())
	go func() {
		unlock, err := l.lock(ctx, "pod")
		if err != nil {
			t.Error(err)
		}
		acquired <- unlock
	}()
	// Wait until the second caller is queued on the lock.
	for deadline := time.Now().Add(failAfter); l.refs("pod") != 2; {
		if time.Now().After(deadline) {
			t.Fatal("second caller never queued")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-acquired:
		t.Fatal("second caller got the lock while the first held it")
	default:
	}
	unlockA()
	select {
	case unlockB := <-acquired:
		unlockB()
	case <-time.After(failAfter):
		t.Fatal("second caller never got the lock after it was released")
	}
	if l.size() != 0 {
		t.Errorf("%d lock entries left after every caller left", l.size())
	}
}

func TestPodLocksMutualExclusionUnderLoad(t *testing.T) {
	l := newPodLocks()
	var inside atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 20 {
				unlock, err := l.lock(context.Background(), "pod")
				if err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d callers inside at once", n)
				}
				inside.Add(-1)
				unlock()
			}
		})
	}
	wg.Wait()
	if l.size() != 0 {
		t.Errorf("%d lock entries left", l.size())
	}
}

func TestPodLocksDifferentKeysDoNotWait(t *testing.T) {
	l := newPodLocks()
	ctx := context.Background()
	unlockA, err := l.lock(ctx, "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	defer unlockA()
	// pod-a stays locked until pod-b has been locked and released: if
	// pod-b waited on pod-a this would never finish.
	done := make(chan struct{})
	go func() {
		defer close(done)
		unlockB, err := l.lock(ctx, "pod-b")
		if err != nil {
			t.Error(err)
			return
		}
		unlockB()
	}()
	select {
	case <-done:
	case <-time.After(failAfter):
		t.Fatal("pod-b waited for pod-a's lock")
	}
}

func TestPodLocksWaiterGivesUp(t *testing.T) {
	l := newPodLocks()
	unlock, err := l.lock(context.Background(), "pod")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := l.lock(ctx, "pod")
		errc <- err
	}()
	for l.refs("pod") != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled waiter got the lock")
	}
	if l.refs("pod") != 1 {
		t.Errorf("refs = %d after the waiter left, want 1", l.refs("pod"))
	}
	unlock()
	unlock() // a second call is harmless
	if l.size() != 0 {
		t.Errorf("%d lock entries left", l.size())
	}
}
