package server

import (
	"errors"

	"github.com/nftredir/nftredir/internal/podevents"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"google.golang.org/grpc"
)

// stream sends first (the snapshot), then events, until the watcher
// leaves, the daemon stops (queued events are delivered first) or the
// watcher falls behind. The sends run on a goroutine of their own, so that
// a watcher that fell behind ends now rather than when its peer next
// reads: a Send blocks while the peer's flow-control window is full, and
// only the end of the call (grpc cancels the stream when the handler
// returns) unblocks it. A watcher so cut off must resync from a new
// snapshot, so the events still queued for it are dropped.
func streamWatch(s *podevents.Subscription, out grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse], first []*nftredirv1.WatchPodsResponse) error {
	sent := make(chan error, 1)
	go func() { sent <- sendWatch(s, out, first) }()
	select {
	case err := <-sent:
		return err
	case <-s.Cut:
		return errWatcherBehind
	}
}

var errCut = errors.New("watcher cut off")

func sendWatch(s *podevents.Subscription, out grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse], first []*nftredirv1.WatchPodsResponse) error {
	ctx := out.Context()
	for _, m := range first {
		if err := out.Send(m); err != nil {
			return err
		}
	}
	for {
		select {
		case ev := <-s.Events:
			if err := out.Send(ev); err != nil {
				return err
			}
		case <-s.Done:
			for {
				select {
				case ev := <-s.Events:
					if err := out.Send(ev); err != nil {
						return err
					}
				default:
					return errStopping
				}
			}
		case <-s.Cut:
			return errCut // stream has returned already
		case <-ctx.Done():
			return watcherLeft(ctx.Err())
		}
	}
}
