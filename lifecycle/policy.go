package lifecycle

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// Policy decides which pods AddPod captures. Standalone, the daemon has
// none: every AddPod is captured as requested. In Kubernetes mode the
// cluster is the source of intent, and the kube package's agent is the
// policy: it looks the pod up, and either fills in what the API knows of it
// or leaves it uncaptured.
type Policy interface {
	// Admit runs for every AddPod, under the pod's lock, after the request
	// passed validation and its path was opened as a network namespace;
	// netnsID is the namespace the path names now. An error fails the
	// AddPod with nothing changed (an Error keeps its Kind).
	Admit(ctx context.Context, req *nftredirv1.AddPodRequest, netnsID netns.ID) (Admission, error)
	// Added reports how an admitted AddPod ended: captured, left
	// uncaptured, or failed with err. It must not block.
	Added(req *nftredirv1.AddPodRequest, captured bool, err error)
	// Removed reports a RemovePod of the API (a CNI DEL, an operator),
	// as opposed to a Release the policy asked for itself. It must not
	// block.
	Removed(uid string)
}

// Admission is a Policy's answer to one AddPod.
type Admission struct {
	// NotCaptured, when set, leaves the pod uncaptured and says why. A
	// pod that is enrolled is released (as by RemovePod); nothing else is
	// touched.
	NotCaptured string
	// Request is what to enrol when NotCaptured is empty: the caller's
	// request with the fields the policy fills in. Its pod_uid and
	// netns_path must be the caller's.
	Request *nftredirv1.AddPodRequest
}

// releaseUncaptured releases an enrolled pod that the policy now leaves
// uncaptured, as a RemovePod of it would: rec is its record, and the
// caller holds the pod's lock. The policy is not told: it decided.
func (m *Manager) releaseUncaptured(ctx context.Context, log hclog.Logger, rec *state.Record, why string) error {
	defer m.lockProbe()()
	if _, err := m.removePod(ctx, rec.PodUID, removal{}); err != nil {
		return fmt.Errorf("release pod %s, which the policy leaves uncaptured (%s): %w", rec.PodUID, why, err)
	}
	log.Info("pod released: the enrolment policy leaves it uncaptured", "reason", why)
	return nil
}

// Release takes the pod's capture away for the policy agent, without
// telling the policy (it asked).
func (m *Manager) Release(ctx context.Context, uid string) (bool, error) {
	return m.release(ctx, &nftredirv1.RemovePodRequest{PodUid: uid})
}

// Enrolled returns the pod's record, or nil when it is not enrolled. When
// ZDS is served, its zds_state says whether the node proxy acked the pod:
// the Kubernetes agent annotates the pod only then.
func (m *Manager) Enrolled(uid string) (*nftredirv1.Pod, error) {
	rec, err := m.store.Get(uid)
	if err != nil || rec == nil {
		return nil, err
	}
	return m.withZDSState(podProto(rec)), nil
}

// EnrolledUIDs lists the enrolled pods' keys.
func (m *Manager) EnrolledUIDs() ([]string, error) {
	records, err := m.store.List()
	if err != nil {
		return nil, err
	}
	uids := make([]string, len(records))
	for i, r := range records {
		uids[i] = r.PodUID
	}
	return uids, nil
}
