package server

import (
	"errors"
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
	// done is closed when the daemon is stopping: queued events are
	// delivered, then the watch ends.
	done chan struct{}
	// cut is closed when the watcher fell behind: the watch ends at once,
	// even while a Send is blocked on a peer that does not read.
	cut chan struct{}
}

func newBroadcaster() *broadcaster {
	return &broadcaster{subs: map[*subscriber]struct{}{}}
}

func (b *broadcaster) subscribe() *subscriber {
	s := &subscriber{events: make(chan *nftredirv1.WatchPodsResponse, watchBuffer), done: make(chan struct{}), cut: make(chan struct{})}
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
			close(s.cut)
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

// stream sends first (the snapshot), then events, until the watcher
// leaves, the daemon stops (queued events are delivered first) or the
// watcher falls behind. The sends run on a goroutine of their own, so that
// a watcher that fell behind ends now rather than when its peer next
// reads: a Send blocks while the peer's flow-control window is full, and
// only the end of the call (grpc cancels the stream when the handler
// returns) unblocks it. A watcher so cut off must resync from a new
// snapshot, so the events still queued for it are dropped.
func (b *broadcaster) stream(s *subscriber, out grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse], first []*nftredirv1.WatchPodsResponse) error {
	sent := make(chan error, 1)
	go func() { sent <- b.send(s, out, first) }()
	select {
	case err := <-sent:
		return err
	case <-s.cut:
		return status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; reconnect and treat the new snapshot as the complete set", watchBuffer)
	}
}

var errCut = errors.New("watcher cut off")

func (b *broadcaster) send(s *subscriber, out grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse], first []*nftredirv1.WatchPodsResponse) error {
	ctx := out.Context()
	for _, m := range first {
		if err := out.Send(m); err != nil {
			return err
		}
	}
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
					return status.Error(codes.Unavailable, "nftredird is stopping; reconnect")
				}
			}
		case <-s.cut:
			return errCut // stream has returned already
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}
