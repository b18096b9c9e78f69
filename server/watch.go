package server

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// watchBuffer is how many events a watcher may fall behind before it is
// cut off. Enough for a node's worth of pods churning at once; a watcher
// slower than that should resync from a fresh snapshot anyway.
const watchBuffer = 512

// broadcaster fans pod events out to watchers. Publishing never blocks:
// a watcher whose buffer is full is disconnected instead, so a stuck node
// proxy can never stall AddPod or RemovePod.
type broadcaster struct {
	mu sync.Mutex
	// protects the following fields
	subs   map[*subscriber]struct{}
	closed bool
}

type subscriber struct {
	events chan *nftredirv1.WatchPodsResponse
	// done is closed when the subscriber must stop: it fell behind
	// (overflow) or the daemon is stopping (closing).
	done     chan struct{}
	overflow bool
}

func newBroadcaster() *broadcaster {
	return &broadcaster{subs: map[*subscriber]struct{}{}}
}

func (b *broadcaster) subscribe() *subscriber {
	s := &subscriber{events: make(chan *nftredirv1.WatchPodsResponse, watchBuffer), done: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(s.done)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

func (b *broadcaster) unsubscribe(s *subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

func (b *broadcaster) publish(ev nftredirv1.EventType, pod *nftredirv1.Pod) {
	msg := &nftredirv1.WatchPodsResponse{Event: ev, Pod: pod}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.events <- msg:
		default:
			s.overflow = true
			close(s.done)
			delete(b.subs, s)
		}
	}
}

// close ends every watch; later subscribers end at once.
func (b *broadcaster) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		close(s.done)
		delete(b.subs, s)
	}
}

// endStatus says why a watch was ended by the daemon.
func (b *broadcaster) endStatus(s *subscriber) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.overflow {
		return status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; reconnect and treat the new snapshot as the complete set", watchBuffer)
	}
	return status.Error(codes.Unavailable, "nftredird is stopping; reconnect")
}

// stream sends queued events until the watcher leaves or is cut off.
// Events already queued are delivered before a cut-off is reported, so a
// watcher never misses what happened before it was told to resync.
func (b *broadcaster) stream(s *subscriber, out grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse]) error {
	ctx := out.Context()
	for {
		select {
		case ev := <-s.events:
			if err := out.Send(ev); err != nil {
				return err
			}
		case <-s.done:
			for {
				select {
				case ev := <-s.events:
					if err := out.Send(ev); err != nil {
						return err
					}
				default:
					return b.endStatus(s)
				}
			}
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}
