package lifecycle

import (
	"errors"
	"fmt"

	"github.com/nftredir/nftredir/netns"
)

// The lifecycle's errors say what kind of failure they are, never which
// wire code carries it: the gRPC service maps them to codes in one place
// (server/errors.go), and the Kubernetes agent reads the same kinds.

// Kind classifies a refusal.
type Kind int

const (
	// KindInternal is a failure with no better kind: a bug or a node in
	// trouble.
	KindInternal Kind = iota
	// KindInvalid is a request the caller must fix before retrying.
	KindInvalid
	// KindNotFound is a pod that is not enrolled.
	KindNotFound
	// KindPrecondition is a request that cannot succeed in the node's
	// current state (a namespace gone or enrolled by another pod).
	KindPrecondition
	// KindUnavailable is a condition that clears by itself: the same call
	// repeated may succeed.
	KindUnavailable
	// KindCanceled and KindDeadlineExceeded are the caller's context
	// ending.
	KindCanceled
	KindDeadlineExceeded
)

// Error is a failure of a known kind. Its message is the whole message.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Errorf makes an error of kind k; %w wraps as in fmt.Errorf.
func Errorf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Err: fmt.Errorf(format, args...)}
}

// OpenPathError marks a failure to open the caller's netns path, so that
// errnos which mean "this path is unusable" (a socket, a symlink loop, a
// name too long) are told apart from the same errnos out of netlink.
type OpenPathError struct{ Err error }

func (e *OpenPathError) Error() string { return e.Err.Error() }
func (e *OpenPathError) Unwrap() error { return e.Err }

// ErrNetnsInUse: the namespace is already enrolled under another pod uid.
// Two records for one namespace would overwrite each other's table on
// every reconcile, and would let one caller capture another pod's traffic.
var ErrNetnsInUse = errors.New("network namespace is already enrolled by another pod")

func netnsInUse(path string, id netns.ID, owner string) error {
	return fmt.Errorf("netns_path %s (namespace %s): %w %q; release it with RemovePod first", path, id, ErrNetnsInUse, owner)
}

// proxyNotTaken is an AddPod of a pod that was captured before it, whose
// node proxy did not ack the pod (--zds-require-ack): the pod stays
// captured; the same AddPod repeated is the remedy.
func proxyNotTaken(uid string, err error) error {
	return Errorf(KindUnavailable, "pod %s is captured but the node proxy has not taken it: %v; retry AddPod", uid, err)
}

// proxyNotTakenNew is the same for a pod that was not captured before the
// AddPod: its capture was taken back, so nothing changed.
func proxyNotTakenNew(uid string, err error) error {
	return Errorf(KindUnavailable, "pod %s was not captured: the node proxy has not taken it: %v; nothing was changed; retry AddPod", uid, err)
}

// invalidf is a request the caller must fix before retrying.
func invalidf(format string, args ...any) error {
	return Errorf(KindInvalid, format, args...)
}
