package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/podevents"
	"github.com/nftredir/nftredir/lifecycle"
)

// This file is the only place where errors become gRPC codes. The
// lifecycle engine returns plain wrapped errors, classified by
// lifecycle.Classify with errors.Is on sentinels and errnos, never on
// message text; the socket's own refusals are the statuses below.

// toStatus turns any error from the engine's work into a gRPC status.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	e := lifecycle.Classify(err)
	return status.Error(kindCodes[e.Kind], e.Error())
}

// kindCodes are the codes of the lifecycle's kinds of failure.
var kindCodes = map[lifecycle.Kind]codes.Code{
	lifecycle.KindInternal:         codes.Internal,
	lifecycle.KindInvalid:          codes.InvalidArgument,
	lifecycle.KindNotFound:         codes.NotFound,
	lifecycle.KindPrecondition:     codes.FailedPrecondition,
	lifecycle.KindUnavailable:      codes.Unavailable,
	lifecycle.KindCanceled:         codes.Canceled,
	lifecycle.KindDeadlineExceeded: codes.DeadlineExceeded,
}

// The socket's own refusals, before or around the engine's work.
var (
	errNotReady      = status.Error(codes.Unavailable, "nftredird is starting or stopping (reconciling recorded pods); retry shortly")
	errStopping      = status.Error(codes.Unavailable, "nftredird is stopping; reconnect")
	errNoPeer        = status.Error(codes.Unauthenticated, "caller unknown: no peer information on the connection")
	errNoCredentials = status.Error(codes.Unauthenticated, "caller's credentials could not be read; connect over nftredird's Unix socket")
	errPanicked      = status.Error(codes.Internal, "internal error; the daemon log has the details")
	errWatcherBehind = status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; reconnect and treat the new snapshot as the complete set", podevents.Buffer)
)

func callerNotAllowed(uid, gid uint32) error {
	return status.Errorf(codes.PermissionDenied, "caller uid %d gid %d is not allowed; start nftredird with --allow-uid/--allow-gid", uid, gid)
}

func tooManyWatchers(which string) error {
	return status.Errorf(codes.ResourceExhausted, "too many open WatchPods streams (%s); close one or share a watch", which)
}

// watcherLeft is the end of a watch whose caller went away or ran out of
// time: Canceled or DeadlineExceeded, as grpc reports it.
func watcherLeft(ctxErr error) error { return status.FromContextError(ctxErr).Err() }

// Status is the gRPC status a caller of the API gets for err, for fakes
// of the API that must answer as the daemon does.
func Status(err error) error { return toStatus(err) }
