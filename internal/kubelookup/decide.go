package kubelookup

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/nftredir/nftredir/internal/enrolment"
	"github.com/nftredir/nftredir/internal/retry"
)

// Decision is the enrolment rule's verdict on a pod read from the API.
type Decision struct {
	Captured bool
	// Why the pod is not captured; empty when it is.
	Why string
}

// The schedule of tries of a lookup that failed in a way that may clear:
// as many as the caller's context allows.
var tries = retry.Schedule{Attempts: math.MaxInt, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}

// Decide reads pod ns/name and its namespace and applies sel, as the
// daemon would. uid is the pod's UID from CNI_ARGS (empty if the runtime
// gave none): a pod of that name with another UID is not the sandbox's
// pod. A failure that may clear (the API unreachable, overloaded) is tried
// again until ctx ends; an error means there is no decision, and the
// caller must not guess one.
func (c *Client) Decide(ctx context.Context, sel enrolment.Selector, ns, name, uid string) (Decision, error) {
	return retry.Do(ctx, tries, transient, func(ctx context.Context) (Decision, error) {
		return c.decideOnce(ctx, sel, ns, name, uid)
	})
}

func (c *Client) decideOnce(ctx context.Context, sel enrolment.Selector, ns, name, uid string) (Decision, error) {
	pod, err := c.Pod(ctx, ns, name)
	if err != nil {
		return Decision{}, fmt.Errorf("read pod %s/%s: %w", ns, name, err)
	}
	if uid != "" && pod.UID != uid && pod.MirrorOf != uid {
		// An older pod of the same name, whose sandbox is being made
		// while the API already holds its successor.
		return Decision{}, fmt.Errorf("pod %s/%s in the Kubernetes API has uid %s, not the sandbox's %s", ns, name, pod.UID, uid)
	}
	nsLabels, err := c.NamespaceLabels(ctx, ns)
	if err != nil {
		return Decision{}, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	captured, why := sel.Captured(pod.Pod, nsLabels)
	return Decision{Captured: captured, Why: why}, nil
}
