package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/state"
)

func TestToStatus(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", err)) }
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"not absolute", &lifecycle.OpenPathError{Err: wrap(netns.ErrNotAbsolute)}, codes.InvalidArgument},
		{"missing", &lifecycle.OpenPathError{Err: wrap(netns.ErrNotExist)}, codes.FailedPrecondition},
		{"not netns", &lifecycle.OpenPathError{Err: wrap(netns.ErrNotNetns)}, codes.FailedPrecondition},
		{"host netns", &lifecycle.OpenPathError{Err: wrap(netns.ErrHostNetns)}, codes.FailedPrecondition},
		{"no access", &lifecycle.OpenPathError{Err: wrap(netns.ErrNoAccess)}, codes.FailedPrecondition},
		{"hung mount", &lifecycle.OpenPathError{Err: wrap(netns.ErrTimeout)}, codes.Unavailable},
		{"in use", fmt.Errorf("netns_path /run/netns/x: %w", lifecycle.ErrNetnsInUse), codes.FailedPrecondition},
		{"foreign capture", capture.CheckForeign("/run/netns/x", capturetest.IstioForeign(false), false), codes.FailedPrecondition},
		// A record of a newer daemon is this daemon's problem, not the
		// caller's namespace: the CNI plugin must not report the path.
		{"newer record", wrap(&state.NewerError{}), codes.Internal},
		{"invalid kind", lifecycle.Errorf(lifecycle.KindInvalid, "bad"), codes.InvalidArgument},
		{"not found kind", lifecycle.Errorf(lifecycle.KindNotFound, "gone"), codes.NotFound},
		{"unavailable kind", wrap(lifecycle.Errorf(lifecycle.KindUnavailable, "later")), codes.Unavailable},
		{"socket at path", &lifecycle.OpenPathError{Err: wrap(unix.ENXIO)}, codes.FailedPrecondition},
		{"symlink loop", &lifecycle.OpenPathError{Err: wrap(unix.ELOOP)}, codes.FailedPrecondition},
		{"ELOOP outside open is a fault", wrap(unix.ELOOP), codes.Internal},
		{"fd exhaustion opening", &lifecycle.OpenPathError{Err: wrap(unix.EMFILE)}, codes.Unavailable},
		{"netlink busy", wrap(unix.EBUSY), codes.Unavailable},
		{"netlink buffers", wrap(unix.ENOBUFS), codes.Unavailable},
		{"unknown kernel error", wrap(unix.EPROTO), codes.Internal},
		{"plain error", errors.New("boom"), codes.Internal},
		{"canceled", wrap(context.Canceled), codes.Canceled},
		{"deadline", wrap(context.DeadlineExceeded), codes.DeadlineExceeded},
		{"status kept", status.Error(codes.NotFound, "x"), codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := toStatus(tt.err)
			if status.Code(got) != tt.want {
				t.Fatalf("code = %v (%v), want %v", status.Code(got), got, tt.want)
			}
			if tt.want == codes.FailedPrecondition && !strings.Contains(status.Convert(got).Message(), "netns") {
				t.Errorf("message %q should name the field to fix", status.Convert(got).Message())
			}
		})
	}
	if toStatus(nil) != nil {
		t.Error("nil must stay nil")
	}
}

// TestEveryKindHasACode: a kind added to the engine without a code here
// would reach callers as OK.
func TestEveryKindHasACode(t *testing.T) {
	for k := lifecycle.KindInternal; k <= lifecycle.KindDeadlineExceeded; k++ {
		c, ok := kindCodes[k]
		if !ok || c == codes.OK {
			t.Errorf("kind %d has no code", k)
		}
	}
}
