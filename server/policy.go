package server

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	// AddPod with nothing changed (a gRPC status error keeps its code).
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

// Enrol is AddPod without the readiness gate, for the daemon's own policy
// agent: it brings pods in line with the cluster before the daemon reports
// SERVING, and while it serves.
func (s *Server) Enrol(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	a, err := validateAdd(req, s.defaults)
	if err != nil {
		return nil, err
	}
	log := s.log.With("pod", a.uid, "netns", a.netnsPath)
	unlock, err := s.locks.lock(ctx, a.uid)
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	// Opened once for the whole call: the policy learns which namespace
	// the path names, and the kernel work goes to that one.
	h, err := s.open(a.netnsPath)
	if err != nil {
		if s.policy != nil {
			s.policy.Added(req, false, err)
		}
		return nil, toStatus(err)
	}
	defer h.Close()
	if s.policy != nil {
		adm, err := s.policy.Admit(ctx, req, h.ID())
		if err != nil {
			s.policy.Added(req, false, err)
			return nil, toStatus(err)
		}
		if adm.NotCaptured != "" {
			if err := s.leaveUncaptured(ctx, log, a.uid, adm.NotCaptured); err != nil {
				s.policy.Added(req, false, err)
				return nil, toStatus(err)
			}
			s.policy.Added(req, false, nil)
			return &nftredirv1.AddPodResponse{NotCapturedReason: adm.NotCaptured}, nil
		}
		if a, err = s.validateAdmitted(req, adm.Request); err != nil {
			s.policy.Added(req, false, err)
			return nil, err
		}
	}
	rec, prev, err := s.addPodAndProbe(ctx, log, a, h)
	if err == nil {
		// Still under the pod's lock, so the proxy hears of this add
		// before any later remove of the same pod.
		err = s.handToProxy(ctx, log, prev, rec)
	}
	if s.policy != nil {
		s.policy.Added(req, err == nil, err)
	}
	if err != nil {
		log.Debug("add refused or failed; nothing changed", "error", err)
		return nil, toStatus(err)
	}
	return &nftredirv1.AddPodResponse{Pod: s.withZDSState(podProto(rec))}, nil
}

// validateAdmitted validates what the policy made of the request exactly
// as a caller's request, saying where a defect came from: fields the
// caller did not send (options from pod annotations) are the policy's.
func (s *Server) validateAdmitted(orig, req *nftredirv1.AddPodRequest) (*addPod, error) {
	if req == nil || req.GetPodUid() != orig.GetPodUid() || req.GetNetnsPath() != orig.GetNetnsPath() {
		return nil, status.Errorf(codes.Internal, "enrolment policy answered for pod %q at %q instead of %q at %q",
			req.GetPodUid(), req.GetNetnsPath(), orig.GetPodUid(), orig.GetNetnsPath())
	}
	a, err := validateAdd(req, s.defaults)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "pod %s/%s: %s (as filled in from the Kubernetes API and the pod's annotations)",
			req.GetPodNamespace(), req.GetPodName(), status.Convert(err).Message())
	}
	return a, nil
}

// leaveUncaptured releases the pod if it is enrolled: the policy no longer
// wants it captured.
func (s *Server) leaveUncaptured(ctx context.Context, log hclog.Logger, uid, reason string) error {
	defer s.lockProbe()()
	existed, err := s.removePod(ctx, uid)
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

// Release takes the pod's capture away for the policy agent, without the
// readiness gate and without telling the policy (it asked).
func (s *Server) Release(ctx context.Context, uid string) (bool, error) {
	if err := validateUID(uid); err != nil {
		return false, err
	}
	unlock, err := s.locks.lock(ctx, uid)
	if err != nil {
		return false, toStatus(err)
	}
	defer unlock()
	defer s.lockProbe()()
	existed, err := s.removePod(ctx, uid)
	return existed, toStatus(err)
}

// Enrolled returns the pod's record, or nil when it is not enrolled.
func (s *Server) Enrolled(uid string) (*nftredirv1.Pod, error) {
	rec, err := s.store.Get(uid)
	if err != nil || rec == nil {
		return nil, toStatus(err)
	}
	return podProto(rec), nil
}

// EnrolledUIDs lists the enrolled pods' keys.
func (s *Server) EnrolledUIDs() ([]string, error) {
	records, err := s.store.List()
	if err != nil {
		return nil, toStatus(err)
	}
	uids := make([]string, len(records))
	for i, r := range records {
		uids[i] = r.PodUID
	}
	return uids, nil
}
