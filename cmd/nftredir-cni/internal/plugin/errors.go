package plugin

import (
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/rpc"
)

// CNI error codes the plugin returns besides the library's own (1 version,
// 4 environment, 6 decoding, 7 config). 0-99 are the spec's; 100 and up
// are ours. docs/cni.md lists them for operators.
const (
	// ErrTryAgainLater (11, spec): the daemon could not be reached or said
	// it is unavailable; the runtime retries the sandbox.
	ErrTryAgainLater = types.ErrTryAgainLater
	// ErrPluginNotAvailable (50, spec 1.1 STATUS): the daemon cannot take
	// ADDs now. libcni v1.3.0 has no constant for it yet.
	ErrPluginNotAvailable uint = 50
	// ErrNetnsRefused (8, as pkg/skel uses it): the daemon refused the
	// namespace path (missing, not a network namespace, the node's own,
	// or enrolled by another pod).
	ErrNetnsRefused = types.ErrInvalidNetNS
	// ErrNotAllowed: the daemon refused this caller (its uid/gid is not
	// allowed, or its credentials could not be read).
	ErrNotAllowed uint = 100
	// ErrNotCaptured: CHECK found the pod not enrolled, enrolled with
	// another namespace or other IPs, or its rules absent or changed.
	ErrNotCaptured uint = 101
	// ErrInternal (999, library): anything the daemon could not classify.
	ErrInternal = types.ErrInternal
)

// daemonError turns an error of a client call into a CNI error whose
// message says what was asked, of which daemon, and what it answered.
// what is a short verb phrase ("enrol pod x").
func daemonError(err error, what, socket string) *types.Error {
	code, msg := rpc.CodeOf(err), rpc.MessageOf(err)
	details := fmt.Sprintf("grpc code %s from %s", code, socket)
	switch code {
	case rpc.Unavailable, rpc.DeadlineExceeded, rpc.ResourceExhausted, rpc.Aborted, rpc.Canceled:
		return types.NewError(ErrTryAgainLater, fmt.Sprintf("%s: %s", what, unreachable(socket, msg)), details)
	case rpc.InvalidArgument:
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("%s: nftredird refused the request: %s", what, msg), details)
	case rpc.FailedPrecondition:
		return types.NewError(ErrNetnsRefused, fmt.Sprintf("%s: nftredird refused the network namespace: %s", what, msg), details)
	case rpc.PermissionDenied, rpc.Unauthenticated:
		return types.NewError(ErrNotAllowed, fmt.Sprintf("%s: nftredird does not allow this caller: %s (run the plugin as root, or add its uid to the daemon's --allow-uid)", what, msg), details)
	default:
		return types.NewError(ErrInternal, fmt.Sprintf("%s: nftredird failed: %s", what, msg), details)
	}
}

// unreachable explains an Unavailable. The socket's absence is checked
// here, for the message only, because it is by far the commonest cause
// and the gRPC text buries it.
func unreachable(socket, msg string) string {
	if _, err := os.Stat(socket); errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("nftredird is not running: its socket %s does not exist; start the daemon, then retry", socket)
	}
	return fmt.Sprintf("nftredird at %s is not available (%s); retry when it is running", socket, msg)
}

// isGone reports whether a client error means the daemon could not be
// asked at all, which DEL treats as success.
func isGone(err error) bool {
	switch rpc.CodeOf(err) {
	case rpc.Unavailable, rpc.DeadlineExceeded, rpc.Canceled:
		return true
	}
	return false
}

func invalidConf(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, args...), "")
}
