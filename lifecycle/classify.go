package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/state"
)

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

// Classify gives any error of the engine's work its kind and the message a
// caller reads: a kind it already carries, or one told from the netns
// sentinels, the store's errors, context ends and errnos. nil stays nil.
func Classify(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return &Error{Kind: e.Kind, Err: err}
	}
	switch {
	case errors.Is(err, netns.ErrNotAbsolute):
		return classified(KindInvalid, "netns_path: %v; give the absolute path of the pod's network namespace", err)
	case errors.Is(err, netns.ErrNotExist):
		return classified(KindPrecondition, "netns_path: %v; pass the path of an existing pod network namespace (e.g. /var/run/netns/cni-...)", err)
	case errors.Is(err, netns.ErrNotNetns):
		return classified(KindPrecondition, "netns_path: %v; pass a network namespace file such as /var/run/netns/NAME or /proc/PID/ns/net", err)
	case errors.Is(err, netns.ErrHostNetns):
		return classified(KindPrecondition, "netns_path: %v; pods on the host network cannot be enrolled", err)
	case errors.Is(err, netns.ErrNoAccess):
		return classified(KindPrecondition, "netns_path: %v; the daemon may not open it, so it cannot be enrolled", err)
	case errors.Is(err, netns.ErrTimeout):
		// Unavailable, not DeadlineExceeded: the daemon, not the caller's
		// deadline, gave up, nothing was changed, and the same call may
		// succeed once the mount answers. DeadlineExceeded would read as
		// the caller's own deadline having been too short.
		return classified(KindUnavailable, "netns_path: %v; nothing was changed, retry once the mount answers", err)
	case errors.Is(err, ErrNetnsInUse):
		return classified(KindPrecondition, "%v", err)
	case errors.Is(err, capture.ErrForeignCapture):
		// Not the caller's request: the namespace must change first
		// (or the daemon's --take-over-foreign-capture).
		return classified(KindPrecondition, "%v", err)
	case errors.As(err, new(*state.NewerError)):
		// Not the caller's request nor its namespace: this daemon is
		// older than the one that wrote the pod's record.
		return classified(KindInternal, "%v", err)
	case errors.Is(err, context.Canceled):
		return classified(KindCanceled, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return classified(KindDeadlineExceeded, "%v", err)
	}
	var pe *OpenPathError
	if errors.As(err, &pe) && isAny(err, unusablePathErrnos) {
		return classified(KindPrecondition, "netns_path: %v; it cannot be a network namespace", err)
	}
	if isAny(err, transientErrnos) {
		return classified(KindUnavailable, "transient kernel error, retry: %v", err)
	}
	return classified(KindInternal, "%v", err)
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func classified(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Err: fmt.Errorf(format, args...)}
}
