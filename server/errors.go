package server

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/state"
)

// This file is the only place where errors become gRPC codes. Everything
// below the service returns plain wrapped errors; the decision is made
// here with errors.Is on sentinels and errnos, never on message text.

// invalidArgument is a request the caller must fix before retrying.
func invalidArgument(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// openPathError marks a failure to open the caller's netns path, so that
// errnos which mean "this path is unusable" (a socket, a symlink loop, a
// name too long) are told apart from the same errnos out of netlink.
type openPathError struct{ err error }

func (e *openPathError) Error() string { return e.err.Error() }
func (e *openPathError) Unwrap() error { return e.err }

// unusablePathErrnos, when opening the caller's path fails with them, mean
// the path cannot be a network namespace, not that the node is in trouble.
var unusablePathErrnos = []error{
	unix.ENXIO, unix.ELOOP, unix.ENAMETOOLONG, unix.EACCES, unix.EPERM,
	unix.EISDIR, unix.EINVAL, unix.EOPNOTSUPP, unix.ENODEV, unix.ETXTBSY,
}

// transientErrnos are kernel conditions that clear by themselves; the
// caller may repeat the call unchanged (every RPC is idempotent).
var transientErrnos = []error{
	unix.EAGAIN, unix.EBUSY, unix.EINTR, unix.ENOBUFS, unix.ENOMEM,
	unix.EMFILE, unix.ENFILE, unix.ETIMEDOUT, unix.ERESTART,
}

// toStatus turns any error from the service's work into a gRPC status.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, netns.ErrNotAbsolute):
		return status.Errorf(codes.InvalidArgument, "netns_path: %v; give the absolute path of the pod's network namespace", err)
	case errors.Is(err, netns.ErrNotExist):
		return status.Errorf(codes.FailedPrecondition, "netns_path: %v; pass the path of an existing pod network namespace (e.g. /var/run/netns/cni-...)", err)
	case errors.Is(err, netns.ErrNotNetns):
		return status.Errorf(codes.FailedPrecondition, "netns_path: %v; pass a network namespace file such as /var/run/netns/NAME or /proc/PID/ns/net", err)
	case errors.Is(err, netns.ErrHostNetns):
		return status.Errorf(codes.FailedPrecondition, "netns_path: %v; pods on the host network cannot be enrolled", err)
	case errors.Is(err, netns.ErrNoAccess):
		return status.Errorf(codes.FailedPrecondition, "netns_path: %v; the daemon may not open it, so it cannot be enrolled", err)
	case errors.Is(err, netns.ErrTimeout):
		// Unavailable, not DeadlineExceeded: the daemon, not the caller's
		// deadline, gave up, nothing was changed, and the same call may
		// succeed once the mount answers. DeadlineExceeded would read as
		// the caller's own deadline having been too short.
		return status.Errorf(codes.Unavailable, "netns_path: %v; nothing was changed, retry once the mount answers", err)
	case errors.Is(err, errNetnsInUse):
		return status.Errorf(codes.FailedPrecondition, "%v", err)
	case errors.As(err, new(*state.NewerError)):
		return status.Errorf(codes.FailedPrecondition, "%v", err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%v", err)
	}
	var pe *openPathError
	if errors.As(err, &pe) && isAny(err, unusablePathErrnos) {
		return status.Errorf(codes.FailedPrecondition, "netns_path: %v; it cannot be a network namespace", err)
	}
	if isAny(err, transientErrnos) {
		return status.Errorf(codes.Unavailable, "transient kernel error, retry: %v", err)
	}
	return status.Errorf(codes.Internal, "%v", err)
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// errNetnsInUse: the namespace is already enrolled under another pod uid.
// Two records for one namespace would overwrite each other's table on
// every reconcile, and would let one caller capture another pod's traffic.
var errNetnsInUse = errors.New("network namespace is already enrolled by another pod")

func netnsInUse(path string, id netns.ID, owner string) error {
	return fmt.Errorf("netns_path %s (namespace %s): %w %q; release it with RemovePod first", path, id, errNetnsInUse, owner)
}

// proxyNotTaken is an AddPod that committed the capture but whose node
// proxy did not ack the pod (--zds-require-ack). Unavailable, because the
// same AddPod repeated is the remedy.
func proxyNotTaken(uid string, err error) error {
	return status.Errorf(codes.Unavailable, "pod %s is captured but the node proxy has not taken it: %v; retry AddPod", uid, err)
}
