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
)

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
				if err := h.Remove(context.Background(), l.Routing.Netns()); err != nil {
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
		if err := h.Remove(ctx, rec.Routing.Netns()); err != nil {
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
