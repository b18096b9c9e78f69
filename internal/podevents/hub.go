// Package podevents fans pod events out to watchers: the lifecycle engine
// publishes, the WatchPods streams subscribe.
package podevents

import (
	"sync"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Buffer is how many events a watcher may fall behind before it is
// cut off. Enough for a node's worth of pods churning at once; a watcher
// slower than that should resync from a fresh snapshot anyway.
const Buffer = 512

// Hub fans pod events out to watchers. Publishing never blocks:
// a watcher whose buffer is full is disconnected instead, so a stuck node
// proxy can never stall AddPod or RemovePod.
type Hub struct {
	mu sync.Mutex
	// protects the following fields
	subs   map[*Subscription]struct{}
	closed bool
}

// Subscription is one watcher's queue of pod events.
type Subscription struct {
	// Events delivers the watcher's events in order.
	Events chan *nftredirv1.WatchPodsResponse
	// Done is closed when the daemon is stopping: queued events are
	// delivered, then the watch ends.
	Done chan struct{}
	// Cut is closed when the watcher fell behind: the watch ends at once,
	// even while a Send is blocked on a peer that does not read.
	Cut chan struct{}
}

// NewHub returns a hub with no watchers.
func NewHub() *Hub {
	return &Hub{subs: map[*Subscription]struct{}{}}
}

// Subscribe adds a watcher.
func (b *Hub) Subscribe() *Subscription {
	s := &Subscription{Events: make(chan *nftredirv1.WatchPodsResponse, Buffer), Done: make(chan struct{}), Cut: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(s.Done)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

// Unsubscribe removes a watcher.
func (b *Hub) Unsubscribe(s *Subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

// Publish sends one event to every watcher.
func (b *Hub) Publish(ev nftredirv1.EventType, pod *nftredirv1.Pod) {
	msg := &nftredirv1.WatchPodsResponse{Event: ev, Pod: pod}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.Events <- msg:
		default:
			close(s.Cut)
			delete(b.subs, s)
		}
	}
}

// Close ends every watch; later subscribers end at once.
func (b *Hub) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		close(s.Done)
		delete(b.subs, s)
	}
}

// Len counts the current watchers.
func (b *Hub) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}
