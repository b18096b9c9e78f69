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

	"github.com/nftredir/nftredir/netns"
)

func TestToStatus(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", err)) }
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"not absolute", &openPathError{wrap(netns.ErrNotAbsolute)}, codes.InvalidArgument},
		{"missing", &openPathError{wrap(netns.ErrNotExist)}, codes.FailedPrecondition},
		{"not netns", &openPathError{wrap(netns.ErrNotNetns)}, codes.FailedPrecondition},
		{"host netns", &openPathError{wrap(netns.ErrHostNetns)}, codes.FailedPrecondition},
		{"no access", &openPathError{wrap(netns.ErrNoAccess)}, codes.FailedPrecondition},
		{"hung mount", &openPathError{wrap(netns.ErrTimeout)}, codes.Unavailable},
		{"in use", netnsInUse("/run/netns/x", netns.ID{Dev: 4, Ino: 9}, "other"), codes.FailedPrecondition},
		{"socket at path", &openPathError{wrap(unix.ENXIO)}, codes.FailedPrecondition},
		{"symlink loop", &openPathError{wrap(unix.ELOOP)}, codes.FailedPrecondition},
		{"ELOOP outside open is a fault", wrap(unix.ELOOP), codes.Internal},
		{"fd exhaustion opening", &openPathError{wrap(unix.EMFILE)}, codes.Unavailable},
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
