package server

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// recordingStream collects what a watch sends.
type recordingStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent []*nftredirv1.WatchPodsResponse
}

func (r *recordingStream) Context() context.Context { return r.ctx }
func (r *recordingStream) Send(m *nftredirv1.WatchPodsResponse) error {
	r.sent = append(r.sent, m)
	return nil
}

func TestBroadcasterCutsOffSlowWatcher(t *testing.T) {
	b := newBroadcaster()
	slow := b.subscribe()
	for i := 0; i < watchBuffer+1; i++ {
		b.publish(nftredirv1.EventType_EVENT_TYPE_ADDED, &nftredirv1.Pod{PodUid: "p"})
	}
	// Publishing returned although nobody read: it never blocks.
	out := &recordingStream{ctx: context.Background()}
	err := b.stream(slow, out)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("slow watcher ended with %v, want ResourceExhausted", err)
	}
	if len(out.sent) != watchBuffer {
		t.Errorf("delivered %d queued events before the cut-off, want %d", len(out.sent), watchBuffer)
	}
	// Later events go to nobody and still do not block.
	b.publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, &nftredirv1.Pod{PodUid: "p"})
}

func TestBroadcasterCloseEndsWatches(t *testing.T) {
	b := newBroadcaster()
	s := b.subscribe()
	b.publish(nftredirv1.EventType_EVENT_TYPE_ADDED, &nftredirv1.Pod{PodUid: "p"})
	b.close()
	out := &recordingStream{ctx: context.Background()}
	if err := b.stream(s, out); status.Code(err) != codes.Unavailable {
		t.Fatalf("watch ended with %v, want Unavailable", err)
	}
	if len(out.sent) != 1 {
		t.Errorf("queued event lost at close")
	}
	late := b.subscribe()
	if err := b.stream(late, &recordingStream{ctx: context.Background()}); status.Code(err) != codes.Unavailable {
		t.Errorf("watch after close: %v", err)
	}
}
