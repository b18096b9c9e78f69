package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/podevents"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

// addPodAndProbe is addPod followed by the node table update, both under
// lockProbe.
func (m *Manager) addPodAndProbe(ctx context.Context, log hclog.Logger, a *addPod, h capture.Namespace) (*state.Record, *state.Record, error) {
	defer m.lockProbe()()
	rec, prev, err := m.addPod(ctx, log, a, h)
	if err != nil {
		return nil, nil, err
	}
	m.probeAdded(ctx, log, rec)
	return rec, prev, nil
}

// addPod runs under the pod's lock. The record (intent) is written before
// the kernel is touched, and rolled back if the kernel work fails or
// panics, so a crash at any instant leaves either the pod's previous state
// or a record that reconcile completes, and an error reply means nothing
// changed. It returns the new record and the previous one (nil for a new
// pod).
func (m *Manager) addPod(ctx context.Context, log hclog.Logger, a *addPod, h capture.Namespace) (*state.Record, *state.Record, error) {
	rs, err := nft.Build(a.spec)
	if err != nil {
		return nil, nil, invalidf("options: %v", err)
	}
	id := h.ID()
	prev, err := m.store.Get(a.uid)
	if err != nil {
		return nil, nil, err
	}
	var prevID netns.ID
	if prev != nil {
		prevID, _ = prev.NamespaceID() // records are checked when read
	}
	sameNS := prev != nil && prevID == id
	if err := m.claim(h, a.uid); err != nil {
		return nil, nil, err
	}

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
	// The rollback covers the write itself: Put can fail after its rename
	// (the directory fsync), leaving the new record in place.
	committed := false
	defer func() {
		if !committed {
			m.rollbackAdd(log, h, rec, prev, sameNS)
		}
	}()
	if err := m.store.Put(rec); err != nil {
		return nil, nil, err
	}
	if err := m.engine.Apply(ctx, h, rs, m.routing); err != nil {
		return nil, nil, err
	}
	committed = true

	if sameNS && prev.Routing != rec.Routing {
		// Daemon flags changed the routing since the pod was enrolled: drop
		// the old rule for the new one.
		if err := m.engine.Reroute(ctx, h, prev.Routing.Netns(), m.routing); err != nil {
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
	return rec, prev, nil
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
// the reason for the failure.
func (m *Manager) rollbackAdd(log hclog.Logger, h capture.Namespace, rec, prev *state.Record, sameNS bool) {
	ctx := context.Background()
	var errs []error
	if !sameNS {
		// The namespace had nothing of this pod's before the call. Apply is
		// atomic, so the table is as it was; routing may have been added.
		if err := m.engine.Remove(ctx, h, m.routing); err != nil {
			// Remove stops at a table it cannot delete, but no table of
			// this pod's is there to keep the routing for: the routing
			// goes regardless, or nothing would ever take it out.
			errs = append(errs, err, m.engine.RemoveRouting(ctx, h, m.routing))
		}
		m.owners.release(h.ID(), rec.PodUID)
	} else if rec.Routing != prev.Routing {
		// Apply installs the routing before the table, so a failed
		// re-apply under changed daemon flags may have left the new
		// routing next to the recorded one, where nothing would ever
		// remove it. Reroute takes it out and makes sure of the
		// recorded one, whose route the two may share.
		if err := m.engine.Reroute(ctx, h, m.routing, prev.Routing.Netns()); err != nil {
			errs = append(errs, err)
		}
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

// finishLeaving removes the pod's table and routing from the namespace
// it moved out of (rec.Leaving), if its path still leads there and no
// other pod has enrolled it since, then clears rec.Leaving. Failures are
// logged; reconcile calls this again for records that still carry it.
func (m *Manager) finishLeaving(log hclog.Logger, rec *state.Record) {
	l := rec.Leaving
	if l == nil {
		return
	}
	leftID, _ := netns.ParseID(l.NetnsID)
	if owner := m.owners.owner(leftID); owner == "" || owner == rec.PodUID {
		if h, err := m.engine.Open(l.NetnsPath); err != nil {
			log.Debug("previous namespace is gone; nothing to remove there", "old_netns", l.NetnsPath, "error", err)
		} else {
			defer h.Close()
			if h.ID() != leftID {
				log.Debug("previous path now names another namespace; leaving it alone", "old_netns", l.NetnsPath)
			} else {
				if err := m.engine.Remove(context.Background(), h, l.Routing.Netns()); err != nil {
					log.Warn("cannot remove the capture from the pod's previous namespace; reconcile retries", "old_netns", l.NetnsPath, "error", err)
					return
				}
			}
		}
	}
	m.owners.release(leftID, rec.PodUID)
	rec.Leaving = nil
	if err := m.store.Put(rec); err != nil {
		log.Warn("cannot record the move as finished; reconcile retries", "error", err)
	}
}

// lockPod starts a call about one existing pod key: the uid must be
// valid, and the caller gets the pod's lock (release it with the returned
// func).
func (m *Manager) lockPod(ctx context.Context, uid string) (unlock func(), err error) {
	if err := validateUID(uid); err != nil {
		return nil, err
	}
	return m.locks.lock(ctx, uid)
}

// RemovePod releases a pod for a caller of the API (a CNI DEL, an
// operator); unknown pods and vanished namespaces are fine. It reports
// whether the pod was enrolled. req.NetnsPath, when set, makes the
// release conditional on the pod being enrolled there;
// req.NamespaceTeardown leaves the namespace to its deletion.
func (m *Manager) RemovePod(ctx context.Context, req *nftredirv1.RemovePodRequest) (bool, error) {
	existed, err := m.release(ctx, req)
	if err != nil {
		return existed, err
	}
	if m.policy != nil {
		m.policy.Removed(req.GetPodUid())
	}
	return existed, nil
}

// release is a validated RemovePod under the pod's lock, for the API and
// the policy agent alike.
func (m *Manager) release(ctx context.Context, req *nftredirv1.RemovePodRequest) (bool, error) {
	if err := ValidateRemovePod(req); err != nil {
		return false, err
	}
	uid := req.GetPodUid()
	unlock, err := m.locks.lock(ctx, uid)
	if err != nil {
		return false, err
	}
	defer unlock()
	defer m.lockProbe()()
	return m.removePod(ctx, uid, removal{netnsPath: req.GetNetnsPath(), teardown: req.GetNamespaceTeardown()})
}

// removal is how a pod is to be released.
type removal struct {
	// netnsPath, when set, is the only namespace the pod may be released
	// from.
	netnsPath string
	// teardown leaves the namespace untouched: its runtime deletes it.
	teardown bool
}

func (m *Manager) removePod(ctx context.Context, uid string, how removal) (bool, error) {
	rec, err := m.store.Get(uid)
	if err != nil {
		return false, err
	}
	if rec == nil {
		existed, err := m.releaseQuarantined(ctx, uid)
		if err != nil || how.teardown {
			return existed, err
		}
		// A release that may enter the namespace need not wait for the
		// grace of an earlier one that did not.
		return existed, m.settleLeftovers(ctx, uid, how.netnsPath)
	}
	if how.netnsPath != "" && rec.NetnsPath != how.netnsPath {
		return false, Errorf(KindPrecondition, "pod %s is enrolled with netns_path %s, not %s; nothing was released", uid, rec.NetnsPath, how.netnsPath)
	}
	// A release already under way has recorded that it enters the
	// namespace; it finishes that way.
	if how.teardown && !rec.Removing {
		if err := m.leaveForTeardown(ctx, rec); err != nil {
			return true, err
		}
		_, err = m.releaseQuarantined(ctx, uid)
		return true, err
	}
	if !rec.Removing {
		marked := *rec
		marked.Removing = true
		if err := m.store.Put(&marked); err != nil {
			return true, fmt.Errorf("record the removal before releasing the pod (nothing was changed): %w", err)
		}
		rec = &marked
	}
	if err := m.finishRemove(ctx, rec); err != nil {
		return true, err
	}
	// A record set aside before this one was written may name another
	// namespace that still holds the pod's capture, and so may an
	// earlier sandbox left for its teardown.
	if _, err = m.releaseQuarantined(ctx, uid); err != nil {
		return true, err
	}
	if how.netnsPath == "" {
		err = m.settleLeftovers(ctx, uid, "")
	}
	return true, err
}

// finishRemove releases a pod whose record is marked Removing: its table
// and routing, then the record. Failures leave the record marked, for a
// repeated RemovePod or reconcile to finish.
func (m *Manager) finishRemove(ctx context.Context, rec *state.Record) error {
	uid := rec.PodUID
	log := m.log.With("pod", uid, "netns", rec.NetnsPath)
	id, _ := rec.NamespaceID()
	h, err := m.open(rec.NetnsPath)
	switch {
	case err == nil && h.ID() == id:
		defer h.Close()
		if err := m.engine.Remove(ctx, h, rec.Routing.Netns()); err != nil {
			return err
		}
	case err == nil:
		h.Close()
		log.Info("path names another namespace now; leaving it alone", "netns_id", h.ID().String(), "recorded_netns_id", id.String())
	case namespaceGone(err):
		log.Debug("namespace already gone", "error", err)
	default:
		return err
	}
	if err := m.store.Delete(uid); err != nil {
		return err
	}
	m.owners.release(id, uid)
	m.released(ctx, log, uid)
	m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
	log.Info("pod released")
	return nil
}

// GetPod returns the record and a live comparison with the kernel.
func (m *Manager) GetPod(ctx context.Context, uid string) (*nftredirv1.GetPodResponse, error) {
	unlock, err := m.lockPod(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.getPod(ctx, uid)
}

func (m *Manager) getPod(ctx context.Context, uid string) (*nftredirv1.GetPodResponse, error) {
	rec, err := m.store.Get(uid)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return m.getQuarantined(uid)
	}
	resp := &nftredirv1.GetPodResponse{Pod: m.withZDSState(podProto(rec))}
	live, err := m.inspect(ctx, rec)
	if err != nil {
		return nil, err
	}
	resp.LiveRuleset = live.Text
	resp.Detail = live.detail
	if rec.Removing {
		resp.Detail = strings.TrimPrefix(resp.Detail+"; a RemovePod of the pod did not finish: a repeated RemovePod or reconcile releases it", "; ")
	}
	switch {
	case live.gone:
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE
	case live.Table == nft.StatusAbsent:
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_ABSENT
	case live.Table == nft.StatusDrifted || !live.Routing.Complete() || live.Foreign != "":
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED
	default:
		resp.SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC
	}
	return resp, nil
}

// ListPods returns every record and every quarantined one, without
// entering any namespace.
func (m *Manager) ListPods() (*nftredirv1.ListPodsResponse, error) {
	pods, err := m.listPods()
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		m.withZDSState(p)
	}
	qs, err := m.store.QuarantinedAll()
	if err != nil {
		return nil, err
	}
	resp := &nftredirv1.ListPodsResponse{Pods: pods}
	for _, q := range qs {
		resp.Quarantined = append(resp.Quarantined, quarantinedProto(q))
	}
	return resp, nil
}

func (m *Manager) listPods() ([]*nftredirv1.Pod, error) {
	records, err := m.store.List()
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

// Watch subscribes to pod events and returns the subscription and what
// to send before its events: the current set and the snapshot marker.
// Subscribing comes first, so a change racing the listing shows up as an
// event after the snapshot (possibly repeating it), never lost. Release
// the subscription with Unwatch.
func (m *Manager) Watch() (*podevents.Subscription, []*nftredirv1.WatchPodsResponse, error) {
	sub := m.watch.Subscribe()
	pods, err := m.listPods()
	if err != nil {
		m.watch.Unsubscribe(sub)
		return nil, nil, err
	}
	first := make([]*nftredirv1.WatchPodsResponse, 0, len(pods)+1)
	for _, p := range pods {
		first = append(first, &nftredirv1.WatchPodsResponse{Event: nftredirv1.EventType_EVENT_TYPE_ADDED, Pod: p})
	}
	first = append(first, &nftredirv1.WatchPodsResponse{Event: nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE})
	return sub, first, nil
}

// Unwatch ends a subscription of Watch.
func (m *Manager) Unwatch(sub *podevents.Subscription) { m.watch.Unsubscribe(sub) }

// open opens a caller's or a record's namespace path through the engine,
// marking failures as being about the path.
func (m *Manager) open(path string) (capture.Namespace, error) {
	h, err := m.engine.Open(path)
	if err != nil {
		return nil, &OpenPathError{Err: err}
	}
	return h, nil
}

// namespaceGone reports whether an open failure means the path no longer
// leads to a namespace we may program.
func namespaceGone(err error) bool {
	return errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetns) || errors.Is(err, netns.ErrHostNetns)
}
