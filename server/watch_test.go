package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/podevents"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// recordingStream collects what a watch sends; with block set, every
// Send blocks until the context ends, as one to a peer that never reads.
type recordingStream struct {
	grpc.ServerStream
	ctx   context.Context
	block bool
	mu    sync.Mutex
	// protects the following fields
	sent    []*nftredirv1.WatchPodsResponse
	blocked int
}

func (r *recordingStream) Context() context.Context { return r.ctx }
func (r *recordingStream) Send(m *nftredirv1.WatchPodsResponse) error {
	r.mu.Lock()
	if r.block {
		r.blocked++
		r.mu.Unlock()
		<-r.ctx.Done()
		r.mu.Lock()
		r.blocked--
		r.mu.Unlock()
		return r.ctx.Err()
	}
	defer r.mu.Unlock()
	r.sent = append(r.sent, m)
	return nil
}

func (r *recordingStream) count() (sent, blocked int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent), r.blocked
}

// TestBroadcasterCutsOffSlowWatcher: a watcher whose peer does not read
// is cut off as soon as it falls behind, while its Send is still blocked,
// and publishing never waits for it.
func TestBroadcasterCutsOffSlowWatcher(t *testing.T) {
	b := podevents.NewHub()
	slow := b.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	out := &recordingStream{ctx: ctx, block: true}
	done := make(chan error, 1)
	go func() {
		done <- streamWatch(slow, out, []*nftredirv1.WatchPodsResponse{{Event: nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE}})
	}()
	for { // until the snapshot's Send blocks
		if _, blocked := out.count(); blocked == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < podevents.Buffer+1; i++ {
		b.Publish(nftredirv1.EventType_EVENT_TYPE_ADDED, &nftredirv1.Pod{PodUid: "p"})
	}
	if err := <-done; status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("slow watcher ended with %v, want ResourceExhausted", err)
	}
	if _, blocked := out.count(); blocked != 1 {
		t.Fatalf("%d sends blocked; the watch must end while its Send is blocked", blocked)
	}
	// grpc cancels the stream when the handler returns: the send ends.
	cancel()
	for {
		if _, blocked := out.count(); blocked == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if b.Len() != 0 {
		t.Error("the cut-off watcher is still subscribed")
	}
	// Later events go to nobody and still do not block.
	b.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, &nftredirv1.Pod{PodUid: "p"})
}

func TestBroadcasterCloseEndsWatches(t *testing.T) {
	b := podevents.NewHub()
	s := b.Subscribe()
	b.Publish(nftredirv1.EventType_EVENT_TYPE_ADDED, &nftredirv1.Pod{PodUid: "p"})
	b.Close()
	out := &recordingStream{ctx: context.Background()}
	if err := streamWatch(s, out, nil); status.Code(err) != codes.Unavailable {
		t.Fatalf("watch ended with %v, want Unavailable", err)
	}
	if n, _ := out.count(); n != 1 {
		t.Errorf("queued event lost at close")
	}
	late := b.Subscribe()
	if err := streamWatch(late, &recordingStream{ctx: context.Background()}, nil); status.Code(err) != codes.Unavailable {
		t.Errorf("watch after close: %v", err)
	}
}
