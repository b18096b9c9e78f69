package lifecycle

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
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
	// pod that is enrolled is released.
	NotCaptured string
	// Request is what to enrol when NotCaptured is empty: the caller's
	// request with the fields the policy fills in. Its pod_uid and
	// netns_path must be the caller's.
	Request *nftredirv1.AddPodRequest
}

// AddPod enrols a pod or re-applies its enrolment. The gRPC service calls
// it once the daemon is ready; the Kubernetes agent calls it directly, to
// bring pods in line with the cluster before the daemon reports SERVING.
func (m *Manager) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	a, err := validateAdd(req, m.defaults)
	if err != nil {
		return nil, err
	}
	log := m.log.With("pod", a.uid, "netns", a.netnsPath)
	unlock, err := m.locks.lock(ctx, a.uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Opened once for the whole call: the policy learns which namespace
	// the path names, and the kernel work goes to that one.
	h, err := m.open(a.netnsPath)
	if err != nil {
		if m.policy != nil {
			m.policy.Added(req, false, err)
		}
		return nil, err
	}
	defer h.Close()
	if m.policy != nil {
		adm, err := m.policy.Admit(ctx, req, h.ID())
		if err != nil {
			m.policy.Added(req, false, err)
			return nil, err
		}
		if adm.NotCaptured != "" {
			if err := m.leaveUncaptured(ctx, log, a.uid, adm.NotCaptured); err != nil {
				m.policy.Added(req, false, err)
				return nil, err
			}
			m.policy.Added(req, false, nil)
			return &nftredirv1.AddPodResponse{NotCapturedReason: adm.NotCaptured}, nil
		}
		if a, err = m.validateAdmitted(req, adm.Request); err != nil {
			m.policy.Added(req, false, err)
			return nil, err
		}
	}
	rec, prev, err := m.addPodAndProbe(ctx, log, a, h)
	if err == nil {
		// Still under the pod's lock, so the proxy hears of this add
		// before any later remove of the same pod.
		err = m.handToProxy(ctx, log, prev, rec)
	}
	if m.policy != nil {
		m.policy.Added(req, err == nil, err)
	}
	if err != nil {
		log.Debug("add refused or failed; nothing changed", "error", err)
		return nil, err
	}
	return &nftredirv1.AddPodResponse{Pod: m.withZDSState(podProto(rec))}, nil
}

// validateAdmitted validates what the policy made of the request exactly
// as a caller's request, saying where a defect came from: fields the
// caller did not send (options from pod annotations) are the policy's.
func (m *Manager) validateAdmitted(orig, req *nftredirv1.AddPodRequest) (*addPod, error) {
	if req == nil || req.GetPodUid() != orig.GetPodUid() || req.GetNetnsPath() != orig.GetNetnsPath() {
		return nil, Errorf(KindInternal, "enrolment policy answered for pod %q at %q instead of %q at %q",
			req.GetPodUid(), req.GetNetnsPath(), orig.GetPodUid(), orig.GetNetnsPath())
	}
	a, err := validateAdd(req, m.defaults)
	if err != nil {
		return nil, Errorf(KindInvalid, "pod %s/%s: %s (as filled in from the Kubernetes API and the pod's annotations)",
			req.GetPodNamespace(), req.GetPodName(), err.Error())
	}
	return a, nil
}

// leaveUncaptured releases the pod if it is enrolled: the policy no longer
// wants it captured.
func (m *Manager) leaveUncaptured(ctx context.Context, log hclog.Logger, uid, reason string) error {
	defer m.lockProbe()()
	existed, err := m.removePod(ctx, uid, removal{})
	if err != nil {
		return fmt.Errorf("release pod %s, which the policy leaves uncaptured (%s): %w", uid, reason, err)
	}
	if existed {
		log.Info("pod released: the enrolment policy leaves it uncaptured", "reason", reason)
	} else {
		log.Debug("pod not captured", "reason", reason)
	}
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
