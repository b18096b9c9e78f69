package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/nftredir/nftredir/capture"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"

	"github.com/hashicorp/go-hclog"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/state"
)

func quarantinedProto(q state.Quarantined) *nftredirv1.QuarantinedRecord {
	return &nftredirv1.QuarantinedRecord{
		File:      q.Path,
		PodUid:    q.PodUID,
		NetnsPath: q.Salvage.NetnsPath,
		NetnsId:   q.Salvage.NetnsID,
		Reason:    q.Reason,
	}
}

// getQuarantined answers GetPod for a pod without a record: what its
// quarantined record still says, or NotFound.
func (m *Manager) getQuarantined(uid string) (*nftredirv1.GetPodResponse, error) {
	qs, err := m.store.QuarantinedFor(uid)
	if err != nil {
		return nil, err
	}
	if len(qs) == 0 {
		return nil, Errorf(KindNotFound, "pod %s is not enrolled; ListPods shows the enrolled pods", uid)
	}
	q := qs[len(qs)-1] // the latest: names carry the time they were set aside
	return &nftredirv1.GetPodResponse{
		Pod:        &nftredirv1.Pod{PodUid: uid, NetnsPath: q.Salvage.NetnsPath, NetnsId: q.Salvage.NetnsID},
		SyncStatus: nftredirv1.SyncStatus_SYNC_STATUS_QUARANTINED,
		Detail: fmt.Sprintf("the pod's record was corrupt and is quarantined as %s (%s); its capture may remain in its namespace: RemovePod releases it, AddPod enrols the pod afresh",
			q.Path, q.Reason),
	}, nil
}

// releaseQuarantined releases the capture of uid's quarantined records,
// under uid's lock. It reports whether there were any.
func (m *Manager) releaseQuarantined(ctx context.Context, uid string) (bool, error) {
	qs, err := m.store.QuarantinedFor(uid)
	if err != nil || len(qs) == 0 {
		return false, err
	}
	log := m.log.With("pod", uid)
	for _, q := range qs {
		if err := m.releaseSalvaged(ctx, log.With("file", q.Path), uid, q.Salvage); err != nil {
			return true, fmt.Errorf("release the pod of quarantined record %s: %w", q.Path, err)
		}
		if err := m.store.MarkReleased(q.Path); err != nil {
			return true, err
		}
		log.Info("pod of a quarantined record released", "file", q.Path)
	}
	m.released(ctx, log, uid)
	return true, nil
}

// releaseSalvaged removes uid's capture from the namespace a damaged
// record names. When the record names no usable path, every namespace the
// node has is searched for a table of uid's.
func (m *Manager) releaseSalvaged(ctx context.Context, log hclog.Logger, uid string, sv state.Salvaged) error {
	routing := m.routing
	if sv.Routing != nil && sv.Routing.Netns().Validate() == nil {
		routing = sv.Routing.Netns()
	}
	recorded, idErr := netns.ParseID(sv.NetnsID)
	if idErr != nil {
		recorded = netns.ID{}
	}
	if !filepath.IsAbs(sv.NetnsPath) || filepath.Clean(sv.NetnsPath) != sv.NetnsPath {
		log.Warn("quarantined record names no usable namespace path; searching the node's namespaces for the pod's table")
		return m.releaseFound(ctx, log, uid, routing)
	}
	h, err := m.open(sv.NetnsPath)
	if err != nil {
		if namespaceGone(err) {
			log.Info("the quarantined record's namespace is gone; nothing to release", "netns", sv.NetnsPath, "error", err)
			return nil
		}
		return err
	}
	defer h.Close()
	err = m.releaseIfOwned(ctx, log, h, uid, recorded, routing)
	m.dropClaim(uid, nil, h.ID())
	return err
}

// releaseIfOwned removes our table and routing from h if the table
// carries uid. With no table at all, the routing is removed only if h is
// the very namespace the record named (recorded), the remains of an
// interrupted release; anything else is left alone. Before acting, the
// namespace is claimed for uid and looked at again, so that no AddPod of
// another pod can program it between the look and the removal; a
// namespace that is not uid's is never claimed, so a search through the
// node's namespaces does not hold up other pods' AddPods. The claim is
// the caller's to drop (dropClaim), since uid may still hold the
// namespace for another reason.
func (m *Manager) releaseIfOwned(ctx context.Context, log hclog.Logger, h capture.Namespace, uid string, recorded netns.ID, routing netns.Routing) error {
	id := h.ID()
	log = log.With("netns", h.Path(), "netns_id", id.String())
	ours := func() (table bool, release bool, err error) {
		pod, exists, err := h.Owner(ctx)
		switch {
		case err != nil:
			return false, false, err
		case exists && pod == uid:
			return true, true, nil
		case !exists && id == recorded:
			return false, true, nil
		case exists:
			log.Debug("the namespace's table is not this pod's; leaving it alone", "table_pod", pod)
		default:
			log.Debug("no table of the pod in the namespace; nothing to release")
		}
		return false, false, nil
	}
	if _, release, err := ours(); err != nil || !release {
		return err
	}
	if cur, ok := m.owners.claim(id, uid, ""); !ok {
		log.Debug("namespace is enrolled by another pod; leaving it alone", "owner", cur)
		return nil
	}
	table, release, err := ours()
	if err != nil || !release {
		return err
	}
	if table {
		return h.Remove(ctx, routing)
	}
	return h.RemoveRouting(ctx, routing)
}

// releaseFound searches the node's namespaces for tables carrying uid and
// releases each. It is the last resort for a record too damaged to name
// its namespace: slow (one netlink query per namespace) but rare.
func (m *Manager) releaseFound(ctx context.Context, log hclog.Logger, uid string, routing netns.Routing) error {
	paths := m.engine.Candidates()
	seen := map[netns.ID]bool{}
	var errs []error
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := m.engine.Open(p)
		if err != nil {
			continue // not a namespace we may program, or gone meanwhile
		}
		if seen[h.ID()] {
			h.Close()
			continue
		}
		seen[h.ID()] = true
		// No recorded identity: only a table carrying uid is touched.
		if err := m.releaseIfOwned(ctx, log, h, uid, netns.ID{}, routing); err != nil {
			errs = append(errs, err)
		}
		m.dropClaim(uid, nil, h.ID())
		h.Close()
	}
	return errors.Join(errs...)
}
