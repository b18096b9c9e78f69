package lifecycle

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/calltrace"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

// AddPod enrols a pod or re-applies its enrolment. The gRPC service calls
// it once the daemon is ready; the Kubernetes agent calls it directly, to
// bring pods in line with the cluster before the daemon reports SERVING.
//
// The request takes one path, in this order: validate (validateAdd),
// policy (admit), capture (enrol: the intent recorded, then the kernel
// programmed, then the node table), notify (the node proxy). A pod the
// policy leaves uncaptured leaves the path after the policy (notCaptured).
func (m *Manager) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	a, err := validateAdd(req, m.defaults)
	if err != nil {
		return nil, err
	}
	unlock, err := m.locks.lock(ctx, a.uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	calltrace.Mark(ctx, "lock")
	resp, err := m.addLocked(ctx, req, a)
	if m.policy != nil {
		// Still under the pod's lock: the policy hears of one pod's
		// AddPods in the order they ended.
		m.policy.Added(req, resp.GetPod() != nil, err)
		calltrace.Mark(ctx, "policy_added")
	}
	return resp, err
}

// addLocked is AddPod under the pod's lock, from the namespace on. On
// error the response is nil.
func (m *Manager) addLocked(ctx context.Context, req *nftredirv1.AddPodRequest, a *addPod) (*nftredirv1.AddPodResponse, error) {
	log := m.log.With("pod", a.uid, "netns", a.netnsPath)
	// Opened once for the whole call: the policy learns which namespace
	// the path names, and the kernel work goes to that one.
	h, err := m.open(a.netnsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	calltrace.Mark(ctx, "open")
	a, why, err := m.admit(ctx, req, a, h.ID())
	calltrace.Mark(ctx, "admit")
	if err != nil {
		return nil, err
	}
	if why != "" {
		return m.notCaptured(ctx, log, a.uid, why)
	}
	rec, prev, chg, err := m.enrol(ctx, log, a, h)
	if err == nil {
		// Still under the pod's lock, so the proxy hears of this add
		// before any later remove of the same pod.
		err = m.handToProxy(ctx, log, prev, rec)
		calltrace.Mark(ctx, "zds")
		switch {
		case err == nil:
		case prev == nil && !chg.TookOver:
			// Nothing of the pod's was here before this call, so a
			// failure leaves nothing either: a pod captured to a proxy
			// that does not serve it has no network at all.
			m.abandonAdd(ctx, log, h, rec, chg)
			err = proxyNotTakenNew(rec.PodUID, err)
		default:
			// The pod was captured before this call (or another agent's
			// capture was taken over, which cannot be put back): it stays
			// captured, by the rules this call wrote.
			err = proxyNotTaken(rec.PodUID, err)
		}
	}
	if err != nil {
		log.Debug("add refused or failed", "error", err)
		return nil, err
	}
	return &nftredirv1.AddPodResponse{Pod: m.withZDSState(podProto(rec))}, nil
}

// admit asks the policy, when there is one, what to enrol in namespace id:
// the request as the policy filled it in, validated as a caller's, or the
// policy's reason to leave the pod uncaptured. Without a policy a is
// enrolled as it is.
func (m *Manager) admit(ctx context.Context, req *nftredirv1.AddPodRequest, a *addPod, id netns.ID) (*addPod, string, error) {
	if m.policy == nil {
		return a, "", nil
	}
	adm, err := m.policy.Admit(ctx, req, id)
	if err != nil {
		return nil, "", err
	}
	if adm.NotCaptured != "" {
		return a, adm.NotCaptured, nil
	}
	a, err = m.validateAdmitted(req, adm.Request)
	return a, "", err
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

// notCaptured answers an AddPod the policy leaves uncaptured. A pod that
// is not enrolled is left exactly as it is: the answer is all there is to
// do, and what else the daemon may keep of the pod (a quarantined record,
// a namespace left for teardown) waits for its RemovePod or its grace, as
// it does when the pod is captured. A pod that is enrolled was captured
// under an earlier answer of the policy: it is released, as a step of its
// own (releaseUncaptured).
func (m *Manager) notCaptured(ctx context.Context, log hclog.Logger, uid, why string) (*nftredirv1.AddPodResponse, error) {
	rec, err := m.store.Get(uid)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		log.Debug("pod not captured", "reason", why)
	} else if err := m.releaseUncaptured(ctx, log, rec, why); err != nil {
		return nil, err
	}
	calltrace.Mark(ctx, "release")
	return &nftredirv1.AddPodResponse{NotCapturedReason: why}, nil
}

// enrol is the capture phase: addPod, then the node table, both under
// lockProbe.
func (m *Manager) enrol(ctx context.Context, log hclog.Logger, a *addPod, h capture.Namespace) (*state.Record, *state.Record, capture.Change, error) {
	defer m.lockProbe()()
	rec, prev, chg, err := m.addPod(ctx, log, a, h)
	if err != nil {
		return nil, nil, chg, err
	}
	calltrace.Mark(ctx, "finish")
	m.probeAdded(ctx, log, rec)
	calltrace.Mark(ctx, "probe")
	return rec, prev, chg, nil
}

// abandonAdd takes back a new pod's committed enrolment whose call then
// failed: the kernel work first (the record, still there should this
// stop half way, makes reconcile or the pod's RemovePod finish the
// job), then the record, the node table and the proxies.
func (m *Manager) abandonAdd(ctx context.Context, log hclog.Logger, h capture.Namespace, rec *state.Record, chg capture.Change) {
	ctx = context.WithoutCancel(ctx)
	defer m.lockProbe()()
	if err := h.Undo(ctx, chg); err != nil {
		log.Error("cannot take back the capture of a failed add; reconcile will retry it", "error", err)
		return
	}
	if err := m.store.Delete(rec.PodUID); err != nil {
		log.Error("cannot delete the record of a failed add; reconcile will capture the pod again", "error", err)
		return
	}
	m.owners.release(h.ID(), rec.PodUID)
	m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
	m.released(ctx, log, rec.PodUID)
	log.Info("capture taken back: the add failed after it", "netns_id", h.ID().String())
}

// addPod runs under the pod's lock. The record (intent) is written before
// the kernel is touched, and rolled back if the kernel work fails or
// panics, so a crash at any instant leaves either the pod's previous state
// or a record that reconcile completes, and an error reply means nothing
// changed. It returns the new record and the previous one (nil for a new
// pod).
func (m *Manager) addPod(ctx context.Context, log hclog.Logger, a *addPod, h capture.Namespace) (*state.Record, *state.Record, capture.Change, error) {
	var chg capture.Change
	id := h.ID()
	prev, err := m.store.Get(a.uid)
	if err != nil {
		return nil, nil, chg, err
	}
	var prevID netns.ID
	if prev != nil {
		prevID, _ = prev.NamespaceID() // records are checked when read
	}
	sameNS := prev != nil && prevID == id

	now := m.now()
	rec := &state.Record{
		Version:        state.Version,
		PodUID:         a.uid,
		PodName:        a.name,
		PodNamespace:   a.namespace,
		NetnsPath:      a.netnsPath,
		NetnsID:        id.String(),
		PodIPs:         a.podIPs,
		ServiceAccount: a.serviceAccount,
		Spec:           state.SpecOf(a.spec),
		Routing:        state.RoutingOf(m.routing),
		EnrolledAt:     now,
		UpdatedAt:      now,
	}
	if prev != nil {
		rec.EnrolledAt = prev.EnrolledAt
		rec.Leaving = prev.Leaving
		if !sameNS {
			// An older unfinished move, if any, is superseded: reconcile
			// only tracks the latest namespace left behind.
			rec.Leaving = &state.Leaving{NetnsPath: prev.NetnsPath, NetnsID: prev.NetnsID, Routing: prev.Routing}
		}
	}
	// The spec is built into the kernel's ruleset here, once; the record
	// keeps the same spec (state.SpecOf is lossless: the record test holds
	// SpecOf and Record.Ruleset to it), so reconcile checks the kernel
	// against this very ruleset.
	rs, err := nft.Build(a.spec)
	if err != nil {
		return nil, nil, chg, invalidf("options: %v", err)
	}
	if err := m.claim(h, a.uid); err != nil {
		return nil, nil, chg, err
	}
	// The rollback covers the write itself: Put can fail after its rename
	// (the directory fsync), leaving the new record in place.
	committed := false
	defer func() {
		if !committed {
			m.rollbackAdd(log, h, rec, prev, sameNS, chg)
		}
	}()
	if err := m.store.Put(rec); err != nil {
		return nil, nil, chg, err
	}
	calltrace.Mark(ctx, "record")
	if chg, err = h.Apply(ctx, rs, m.routing); err != nil {
		return nil, nil, chg, err
	}
	committed = true
	calltrace.Mark(ctx, "kernel")

	if sameNS && prev.Routing != rec.Routing {
		// Daemon flags changed the routing since the pod was enrolled: drop
		// the old rule for the new one.
		if err := h.Reroute(ctx, prev.Routing.Netns(), m.routing); err != nil {
			log.Warn("cannot replace the pod's previous policy routing; reconcile will retry", "error", err)
		}
	}
	if prev != nil && !sameNS {
		m.finishLeaving(log, rec)
	}
	if !state.SameIntent(prev, rec) {
		m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_ADDED, podProto(rec))
	}
	switch {
	case prev == nil:
		log.Info("pod enrolled", "netns_id", id.String(), "digest", rs.Digest)
	case !sameNS:
		log.Info("pod moved to another namespace", "netns_id", id.String(), "old_netns", prev.NetnsPath, "old_netns_id", prev.NetnsID)
	default:
		log.Debug("pod re-applied", "digest", rs.Digest)
	}
	return rec, prev, chg, nil
}

// claim makes uid the owner of the opened namespace, unless another pod
// still holds it.
func (m *Manager) claim(h capture.Namespace, uid string) error {
	id := h.ID()
	owner := m.owners.owner(id)
	stale := ""
	if owner != "" && owner != uid {
		if m.stillOwns(owner, id) {
			return netnsInUse(h.Path(), id, owner)
		}
		stale = owner
	}
	if cur, ok := m.owners.claim(id, uid, stale); !ok {
		return netnsInUse(h.Path(), id, cur)
	}
	return nil
}

// stillOwns reports whether owner's record names namespace id and its path
// still leads there. When in doubt it says yes: refusing an AddPod is
// recoverable, handing a namespace to a second pod is not.
func (m *Manager) stillOwns(owner string, id netns.ID) bool {
	// An owner with a call in progress may be moving out of this
	// namespace right now: its record already names the new one, but it
	// has yet to clean up here, and would remove a newcomer's rules. It
	// releases the namespace itself when done; until then it owns it.
	if m.locks.refs(owner) > 0 {
		return true
	}
	r, err := m.store.Get(owner)
	if err != nil {
		return true
	}
	if r == nil || !sameNamespace(r, id) {
		// Released, or moved away; but a namespace left for teardown
		// stays the pod's until it is settled.
		return m.holds(owner, r, id)
	}
	h, err := m.engine.Open(r.NetnsPath)
	if err != nil {
		return !namespaceGone(err)
	}
	defer h.Close()
	return h.ID() == id
}

// rollbackAdd undoes addPod after the record was written. It runs on
// error and on panic, with a context of its own: the caller's may be
// the reason for the failure. In the namespace it takes out only what
// this call created (chg): Apply is atomic, so the table is as it was,
// and of the policy routing only the entries that were not there before
// go. Another agent's identical routing (istio-cni's, by default), or
// the pod's recorded routing under changed daemon flags, stays.
func (m *Manager) rollbackAdd(log hclog.Logger, h capture.Namespace, rec, prev *state.Record, sameNS bool, chg capture.Change) {
	ctx := context.Background()
	var errs []error
	if err := h.Undo(ctx, chg); err != nil {
		errs = append(errs, err)
	}
	if !sameNS {
		m.owners.release(h.ID(), rec.PodUID)
	}
	// A watcher or proxy that took a snapshot while the new record
	// existed may hold the pod as this call would have left it: tell
	// them what stands instead.
	if prev != nil {
		err := m.store.Put(prev)
		errs = append(errs, err)
		if err == nil && !sameNS {
			m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_ADDED, podProto(prev))
			if m.zds != nil {
				m.zds.PodAdded(zds.PodOf(prev))
			}
		}
	} else {
		err := m.store.Delete(rec.PodUID)
		errs = append(errs, err)
		if err == nil {
			m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
			if m.zds != nil {
				// It must not keep a namespace that is not captured.
				m.zds.PodRemoved(rec.PodUID)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("rollback of a failed add is incomplete; reconcile will converge on the recorded state", "error", err)
	}
}
