package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/lifecycle"
)

// This file is the only place where errors become gRPC codes. Everything
// below the service returns plain wrapped errors; the decision is made
// here with errors.Is on sentinels and errnos, never on message text.

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
