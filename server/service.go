package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

var _ nftredirv1.RedirectServiceServer = (*Server)(nil)

func (s *Server) checkReady() error {
	if !s.ready.Load() {
		return status.Error(codes.Unavailable, "nftredird is starting or stopping (reconciling recorded pods); retry shortly")
	}
	return nil
}

// AddPod enrols a pod or re-applies its enrolment.
func (s *Server) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	logging.AddFields(ctx, logging.Fields{"pod", req.GetPodUid(), "netns", req.GetNetnsPath()})
	return s.Enrol(ctx, req)
}

// addPodAndProbe is addPod followed by the node table update, both under
// lockProbe.
func (s *Server) addPodAndProbe(ctx context.Context, log hclog.Logger, a *addPod, h *netns.Handle) (*state.Record, *state.Record, error) {
	defer s.lockProbe()()
	rec, prev, err := s.addPod(ctx, log, a, h)
	if err != nil {
		return nil, nil, err
	}
	s.probeAdded(ctx, log, rec)
	return rec, prev, nil
}

// addPod runs under the pod's lock. The record (intent) is written before
// the kernel is touched, and rolled back if the kernel work fails or
// panics, so a crash at any instant leaves either the pod's previous state
// or a record that reconcile completes, and an error reply means nothing
// changed. It returns the new record and the previous one (nil for a new
// pod).
func (s *Server) addPod(ctx context.Context, log hclog.Logger, a *addPod, h *netns.Handle) (*state.Record, *state.Record, error) {
	rs, err := nft.Build(a.spec)
	if err != nil {
		return nil, nil, invalidArgument("options: %v", err)
	}
	id := h.ID()
	prev, err := s.store.Get(a.uid)
	if err != nil {
		return nil, nil, err
	}
	var prevID netns.ID
	if prev != nil {
		prevID, _ = prev.NamespaceID() // records are checked when read
	}
	sameNS := prev != nil && prevID == id
	if err := s.claim(h, a.uid); err != nil {
		return nil, nil, err
	}

	now := s.now()
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
		Routing:        state.RoutingOf(s.routing),
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
	// The rollback covers the write itself: Put can fail after its rename
	// (the directory fsync), leaving the new record in place.
	committed := false
	defer func() {
		if !committed {
			s.rollbackAdd(log, h, rec, prev, sameNS)
		}
	}()
	if err := s.store.Put(rec); err != nil {
		return nil, nil, err
	}
	if err := netns.EnsureRouting(h, s.routing); err != nil {
		return nil, nil, fmt.Errorf("install policy routing: %w", err)
	}
	if err := s.applier.Apply(ctx, h, rs); err != nil {
		return nil, nil, err
	}
	committed = true

	if sameNS && prev.Routing != rec.Routing {
		// Daemon flags changed the routing since the pod was enrolled: drop
		// the old rule, then make sure the new one survived a shared table.
		if err := netns.RemoveRouting(h, prev.Routing.Netns()); err != nil {
			log.Warn("cannot remove the pod's previous policy routing", "error", err)
		}
		if err := netns.EnsureRouting(h, s.routing); err != nil {
			log.Warn("cannot reinstall policy routing; reconcile will retry", "error", err)
		}
	}
	if prev != nil && !sameNS {
		s.finishLeaving(log, rec)
	}
	if !state.SameIntent(prev, rec) {
		s.watch.publish(nftredirv1.EventType_EVENT_TYPE_ADDED, podProto(rec))
	}
	switch {
	case prev == nil:
		log.Info("pod enrolled", "netns_id", id.String(), "digest", rs.Digest)
	case !sameNS:
		log.Info("pod moved to another namespace", "netns_id", id.String(), "old_netns", prev.NetnsPath, "old_netns_id", prev.NetnsID)
	default:
		log.Debug("pod re-applied", "digest", rs.Digest)
	}
	return rec, prev, nil
}

// claim makes uid the owner of the opened namespace, unless another pod
// still holds it.
func (s *Server) claim(h *netns.Handle, uid string) error {
	id := h.ID()
	owner := s.owners.owner(id)
	stale := ""
	if owner != "" && owner != uid {
		if s.stillOwns(owner, id) {
			return netnsInUse(h.Path(), id, owner)
		}
		stale = owner
	}
	if cur, ok := s.owners.claim(id, uid, stale); !ok {
		return netnsInUse(h.Path(), id, cur)
	}
	return nil
}

// stillOwns reports whether owner's record names namespace id and its path
// still leads there. When in doubt it says yes: refusing an AddPod is
// recoverable, handing a namespace to a second pod is not.
func (s *Server) stillOwns(owner string, id netns.ID) bool {
	// An owner with a call in progress may be moving out of this
	// namespace right now: its record already names the new one, but it
	// has yet to clean up here, and would remove a newcomer's rules. It
	// releases the namespace itself when done; until then it owns it.
	if s.locks.refs(owner) > 0 {
		return true
	}
	r, err := s.store.Get(owner)
	if err != nil {
		return true
	}
	if r == nil {
		return false
	}
	if rid, err := r.NamespaceID(); err != nil || rid != id {
		return false
	}
	h, err := s.guard.Open(r.NetnsPath)
	if err != nil {
		return !namespaceGone(err)
	}
	defer h.Close()
	return h.ID() == id
}

// rollbackAdd undoes addPod after the record was written. It runs on
// error and on panic, with a context of its own: the caller's may be
// the reason for the failure.
func (s *Server) rollbackAdd(log hclog.Logger, h *netns.Handle, rec, prev *state.Record, sameNS bool) {
	ctx := context.Background()
	var errs []error
	if !sameNS {
		// The namespace had nothing of this pod's before the call. Apply is
		// atomic, so the table is as it was; routing may have been added.
		if err := s.applier.Remove(ctx, h); err != nil {
			errs = append(errs, err)
		}
		if err := netns.RemoveRouting(h, s.routing); err != nil {
			errs = append(errs, err)
		}
		s.owners.release(h.ID(), rec.PodUID)
	}
	// A watcher or proxy that took a snapshot while the new record
	// existed may hold the pod as this call would have left it: tell
	// them what stands instead.
	if prev != nil {
		err := s.store.Put(prev)
		errs = append(errs, err)
		if err == nil && !sameNS {
			s.watch.publish(nftredirv1.EventType_EVENT_TYPE_ADDED, podProto(prev))
			if s.zds != nil {
				s.zds.PodAdded(zdsPod(prev))
			}
		}
	} else {
		err := s.store.Delete(rec.PodUID)
		errs = append(errs, err)
		if err == nil {
			s.watch.publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
			if s.zds != nil {
				// It must not keep a namespace that is not captured.
				s.zds.PodRemoved(rec.PodUID)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("rollback of a failed add is incomplete; reconcile will converge on the recorded state", "error", err)
	}
}

// finishLeaving removes the pod's table and routing from the namespace
// it moved out of (rec.Leaving), if its path still leads there and no
// other pod has enrolled it since, then clears rec.Leaving. Failures are
// logged; reconcile calls this again for records that still carry it.
func (s *Server) finishLeaving(log hclog.Logger, rec *state.Record) {
	l := rec.Leaving
	if l == nil {
		return
	}
	leftID, _ := netns.ParseID(l.NetnsID)
	if owner := s.owners.owner(leftID); owner == "" || owner == rec.PodUID {
		if h, err := s.guard.Open(l.NetnsPath); err != nil {
			log.Debug("previous namespace is gone; nothing to remove there", "old_netns", l.NetnsPath, "error", err)
		} else {
			defer h.Close()
			if h.ID() != leftID {
				log.Debug("previous path now names another namespace; leaving it alone", "old_netns", l.NetnsPath)
			} else {
				if err := s.applier.Remove(context.Background(), h); err != nil {
					log.Warn("cannot remove the table from the pod's previous namespace; reconcile retries", "old_netns", l.NetnsPath, "error", err)
					return
				}
				if err := netns.RemoveRouting(h, l.Routing.Netns()); err != nil {
					log.Warn("cannot remove routing from the pod's previous namespace; reconcile retries", "old_netns", l.NetnsPath, "error", err)
					return
				}
			}
		}
	}
	s.owners.release(leftID, rec.PodUID)
	rec.Leaving = nil
	if err := s.store.Put(rec); err != nil {
		log.Warn("cannot record the move as finished; reconcile retries", "error", err)
	}
}

// enterPod starts a call about one existing pod key: the daemon must be
// ready and the uid valid; the request's log line gets the pod, and the
// caller gets the pod's lock (release it with the returned func).
func (s *Server) enterPod(ctx context.Context, uid string) (unlock func(), err error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	if err := validateUID(uid); err != nil {
		return nil, err
	}
	logging.AddFields(ctx, logging.Fields{"pod", uid})
	unlock, err = s.locks.lock(ctx, uid)
	if err != nil {
		return nil, toStatus(err)
	}
	return unlock, nil
}

// RemovePod releases a pod; unknown pods and vanished namespaces are fine.
func (s *Server) RemovePod(ctx context.Context, req *nftredirv1.RemovePodRequest) (*nftredirv1.RemovePodResponse, error) {
	uid := req.GetPodUid()
	unlock, err := s.enterPod(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	defer s.lockProbe()()
	existed, err := s.removePod(ctx, uid)
	if err != nil {
		return nil, toStatus(err)
	}
	if s.policy != nil {
		s.policy.Removed(uid)
	}
	return &nftredirv1.RemovePodResponse{Existed: existed}, nil
}

func (s *Server) removePod(ctx context.Context, uid string) (bool, error) {
	rec, err := s.store.Get(uid)
	if err != nil {
		return false, err
	}
	if rec == nil {
		return s.releaseQuarantined(ctx, uid)
	}
	if !rec.Removing {
		marked := *rec
		marked.Removing = true
		if err := s.store.Put(&marked); err != nil {
			return true, fmt.Errorf("record the removal before releasing the pod (nothing was changed): %w", err)
		}
		rec = &marked
	}
	if err := s.finishRemove(ctx, rec); err != nil {
		return true, err
	}
	// A record set aside before this one was written may name another
	// namespace that still holds the pod's capture.
	_, err = s.releaseQuarantined(ctx, uid)
	return true, err
}

// finishRemove releases a pod whose record is marked Removing: its table
// and routing, then the record. Failures leave the record marked, for a
// repeated RemovePod or reconcile to finish.
func (s *Server) finishRemove(ctx context.Context, rec *state.Record) error {
	uid := rec.PodUID
	log := s.log.With("pod", uid, "netns", rec.NetnsPath)
	id, _ := rec.NamespaceID()
	h, err := s.open(rec.NetnsPath)
	switch {
	case err == nil && h.ID() == id:
		defer h.Close()
		if err := s.applier.Remove(ctx, h); err != nil {
			return err
		}
		if err := netns.RemoveRouting(h, rec.Routing.Netns()); err != nil {
			return fmt.Errorf("remove policy routing: %w", err)
		}
	case err == nil:
		h.Close()
		log.Info("path names another namespace now; leaving it alone", "netns_id", h.ID().String(), "recorded_netns_id", id.String())
	case namespaceGone(err):
		log.Debug("namespace already gone", "error", err)
	default:
		return err
	}
	if err := s.store.Delete(uid); err != nil {
		return err
	}
	s.owners.release(id, uid)
	s.released(ctx, log, uid)
	s.watch.publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
	log.Info("pod released")
	return nil
}

// GetPod returns the record and a live comparison with the kernel.
func (s *Server) GetPod(ctx context.Context, req *nftredirv1.GetPodRequest) (*nftredirv1.GetPodResponse, error) {
	uid := req.GetPodUid()
	unlock, err := s.enterPod(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	resp, err := s.getPod(ctx, uid)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

func (s *Server) getPod(ctx context.Context, uid string) (*nftredirv1.GetPodResponse, error) {
	rec, err := s.store.Get(uid)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return s.getQuarantined(uid)
	}
	resp := &nftredirv1.GetPodResponse{Pod: s.withZDSState(podProto(rec))}
	live, err := s.inspect(ctx, rec)
	if err != nil {
		return nil, err
	}
	resp.LiveRuleset = live.text
	resp.Detail = live.detail
	if rec.Removing {
		resp.Detail = strings.TrimPrefix(resp.Detail+"; a RemovePod of the pod did not finish: a repeated RemovePod or reconcile releases it", "; ")
	}
	switch {
	case live.gone:
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE
	case live.table == nft.StatusAbsent:
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_ABSENT
	case live.table == nft.StatusDrifted || !live.routing.Complete():
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED
	default:
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC
	}
	return resp, nil
}

// ListPods returns every record, without entering any namespace.
func (s *Server) ListPods(ctx context.Context, _ *nftredirv1.ListPodsRequest) (*nftredirv1.ListPodsResponse, error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	pods, err := s.listPods()
	if err != nil {
		return nil, toStatus(err)
	}
	for _, p := range pods {
		s.withZDSState(p)
	}
	qs, err := s.store.QuarantinedAll()
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &nftredirv1.ListPodsResponse{Pods: pods}
	for _, q := range qs {
		resp.Quarantined = append(resp.Quarantined, quarantinedProto(q))
	}
	return resp, nil
}

func (s *Server) listPods() ([]*nftredirv1.Pod, error) {
	records, err := s.store.List()
	if err != nil {
		return nil, err
	}
	slices.SortFunc(records, func(a, b *state.Record) int {
		return cmp.Or(cmp.Compare(a.PodNamespace, b.PodNamespace), cmp.Compare(a.PodName, b.PodName), cmp.Compare(a.PodUID, b.PodUID))
	})
	pods := make([]*nftredirv1.Pod, len(records))
	for i, r := range records {
		pods[i] = podProto(r)
	}
	return pods, nil
}

// WatchPods sends the current set, a snapshot marker, then live events.
func (s *Server) WatchPods(_ *nftredirv1.WatchPodsRequest, stream grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse]) error {
	if err := s.checkReady(); err != nil {
		return err
	}
	release, err := s.watchSlot(stream.Context())
	if err != nil {
		return err
	}
	defer release()
	// Subscribe before listing: a change racing the listing then shows up
	// as an event after the snapshot (possibly repeating it), never lost.
	sub := s.watch.subscribe()
	defer s.watch.unsubscribe(sub)
	pods, err := s.listPods()
	if err != nil {
		return toStatus(err)
	}
	first := make([]*nftredirv1.WatchPodsResponse, 0, len(pods)+1)
	for _, p := range pods {
		first = append(first, &nftredirv1.WatchPodsResponse{Event: nftredirv1.EventType_EVENT_TYPE_ADDED, Pod: p})
	}
	first = append(first, &nftredirv1.WatchPodsResponse{Event: nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE})
	return s.watch.stream(sub, stream, first)
}

// open opens a caller's or a record's namespace path through the guard,
// marking failures as being about the path.
func (s *Server) open(path string) (*netns.Handle, error) {
	h, err := s.guard.Open(path)
	if err != nil {
		return nil, &openPathError{err: err}
	}
	return h, nil
}

// namespaceGone reports whether an open failure means the path no longer
// leads to a namespace we may program.
func namespaceGone(err error) bool {
	return errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetns) || errors.Is(err, netns.ErrHostNetns)
}
