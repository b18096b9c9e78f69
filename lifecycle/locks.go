package lifecycle

import (
	"context"
	"sync"
)

// podLocks serialises calls for one pod while letting calls for different
// pods run in parallel. Entries are refcounted and removed when the last
// holder or waiter leaves, so the map grows with concurrency, not with the
// number of pods ever seen.
type podLocks struct {
	mu sync.Mutex
	// protects the following fields
	locks map[string]*podLock
}

// podLock is a one-slot semaphore: a channel instead of a sync.Mutex so
// that a waiter gives up when its caller's context ends.
type podLock struct {
	slot chan struct{}
	refs int // holders plus waiters
}

func newPodLocks() *podLocks {
	return &podLocks{locks: map[string]*podLock{}}
}

// lock takes the lock for key, waiting at most until ctx ends. The returned
// function releases it and must be called exactly once.
func (p *podLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	p.mu.Lock()
	l := p.locks[key]
	if l == nil {
		l = &podLock{slot: make(chan struct{}, 1)}
		p.locks[key] = l
	}
	l.refs++
	p.mu.Unlock()

	select {
	case l.slot <- struct{}{}:
	case <-ctx.Done():
		p.release(key, l)
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-l.slot
			p.release(key, l)
		})
	}, nil
}

func (p *podLocks) release(key string, l *podLock) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		delete(p.locks, key)
	}
}

// refs reports how many callers hold or wait for key; tests use it to
// know a waiter is queued without sleeping.
func (p *podLocks) refs(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.locks[key]; l != nil {
		return l.refs
	}
	return 0
}

// size is the number of live entries.
func (p *podLocks) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.locks)
}
