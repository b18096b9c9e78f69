package lifecycle

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// DefaultTeardownGrace is how long a namespace released with
// namespace_teardown may keep the pod's capture before nftredird removes
// it itself. Runtimes delete the namespace within milliseconds of CNI DEL;
// the grace only has to outlast a slow node.
const DefaultTeardownGrace = 10 * time.Second

// cleanupTimeout bounds one background pass over the records left for
// teardown.
const cleanupTimeout = time.Minute

// leaveForTeardown releases the pod without entering its namespace: the
// record moves aside, so the pod is no longer enrolled, and the proxy, the
// node table and watchers are told, as after any release. The namespace
// stays the pod's in the owners index until its leftover is settled, so no
// other pod enrols it only to lose its rules to that cleanup.
func (m *Manager) leaveForTeardown(ctx context.Context, rec *state.Record) error {
	uid := rec.PodUID
	log := m.log.With("pod", uid, "netns", rec.NetnsPath)
	if err := m.store.LeaveForTeardown(uid, m.now()); err != nil {
		return err
	}
	m.released(ctx, log, uid)
	m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
	m.scheduleTeardowns(m.teardownGrace)
	log.Info("pod released; its capture goes with the namespace", "grace", m.teardownGrace)
	return nil
}

// scheduleTeardowns makes sure a cleanup pass runs within after. One timer
// serves all leftovers: a pass reschedules itself for the next one due.
func (m *Manager) scheduleTeardowns(after time.Duration) {
	m.teardownMu.Lock()
	defer m.teardownMu.Unlock()
	due := time.Now().Add(after)
	if m.teardownTimer != nil && !m.teardownDue.After(due) {
		return
	}
	if m.teardownTimer != nil {
		m.teardownTimer.Stop()
	}
	m.teardownDue = due
	m.teardownTimer = time.AfterFunc(after, m.runTeardowns)
}

func (m *Manager) runTeardowns() {
	m.teardownMu.Lock()
	m.teardownTimer = nil
	m.teardownMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	next, _ := m.cleanLeftovers(ctx, time.Now())
	if !next.IsZero() {
		m.scheduleTeardowns(time.Until(next))
	}
}

// cleanLeftovers settles every leftover released at least the grace
// before now, each under its pod's lock. It returns when the next one not
// yet due falls due (zero if none) and how many it could not settle, which
// the next pass retries.
func (m *Manager) cleanLeftovers(ctx context.Context, now time.Time) (next time.Time, failed int) {
	all, err := m.store.Leftovers()
	if err != nil {
		m.log.Warn("cannot list the records left for teardown; retrying next pass", "error", err)
		return time.Time{}, 1
	}
	for _, l := range all {
		due := l.ReleasedAt.Add(m.teardownGrace)
		if due.After(now) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		if !m.cleanLeftover(ctx, l) {
			failed++
		}
	}
	return next, failed
}

func (m *Manager) cleanLeftover(ctx context.Context, l state.Leftover) bool {
	uid := l.Record.PodUID
	log := m.log.With("pod", uid, "netns", l.Record.NetnsPath)
	unlock, err := m.locks.lock(ctx, uid)
	if err != nil {
		log.Warn("cannot settle the namespace left for teardown; retrying next pass", "error", err)
		return false
	}
	defer unlock()
	if err := m.settleLeftover(ctx, log, l); err != nil {
		log.Warn("cannot settle the namespace left for teardown; retrying next pass", "error", err)
		return false
	}
	return true
}

// settleLeftovers settles all of uid's leftovers now, grace or not: a
// RemovePod without namespace_teardown means the caller wants the
// namespace clean. The caller holds uid's lock.
func (m *Manager) settleLeftovers(ctx context.Context, uid string) error {
	all, err := m.store.LeftoversOf(uid)
	if err != nil {
		return err
	}
	log := m.log.With("pod", uid)
	for _, l := range all {
		if err := m.settleLeftover(ctx, log.With("netns", l.Record.NetnsPath), l); err != nil {
			return err
		}
	}
	return nil
}

// settleLeftover removes a released pod's capture from the namespace it
// was left in, if that namespace outlived its teardown, and forgets the
// leftover. It leaves the kernel alone when the namespace is enrolled
// again (by the same pod: the table is the new enrolment's) or when its
// path now leads elsewhere. The caller holds the pod's lock.
func (m *Manager) settleLeftover(ctx context.Context, log hclog.Logger, l state.Leftover) error {
	rec := l.Record
	uid := rec.PodUID
	id, _ := rec.NamespaceID()
	cur, err := m.store.Get(uid)
	if err != nil {
		return err
	}
	reenrolled := cur != nil && sameNamespace(cur, id)
	switch {
	case reenrolled:
		log.Debug("namespace enrolled again by the pod; its capture is the new enrolment's")
	case m.owners.owner(id) != "" && m.owners.owner(id) != uid:
		log.Debug("namespace enrolled by another pod since; leaving it alone", "owner", m.owners.owner(id))
	default:
		if err := m.removeLeftCapture(ctx, log, rec.NetnsPath, id, rec.Routing.Netns()); err != nil {
			return err
		}
	}
	// A move the pod made just before its release may not have cleaned
	// the namespace it left yet.
	var leftID netns.ID
	if lv := rec.Leaving; lv != nil {
		leftID, _ = netns.ParseID(lv.NetnsID)
		if o := m.owners.owner(leftID); (cur == nil || !sameNamespace(cur, leftID)) && (o == "" || o == uid) {
			if err := m.removeLeftCapture(ctx, log.With("old_netns", lv.NetnsPath), lv.NetnsPath, leftID, lv.Routing.Netns()); err != nil {
				return err
			}
		}
	}
	if err := m.store.DropLeftover(l.Path); err != nil {
		return err
	}
	if !reenrolled && !m.leftoverHolds(uid, id) {
		m.owners.release(id, uid)
	}
	if rec.Leaving != nil && (cur == nil || !sameNamespace(cur, leftID)) {
		m.owners.release(leftID, uid)
	}
	return nil
}

func sameNamespace(rec *state.Record, id netns.ID) bool {
	rid, err := rec.NamespaceID()
	return err == nil && rid == id
}

// removeLeftCapture removes the table and routing from the namespace at
// path if it is still the namespace id.
func (m *Manager) removeLeftCapture(ctx context.Context, log hclog.Logger, path string, id netns.ID, routing netns.Routing) error {
	h, err := m.open(path)
	switch {
	case err == nil && h.ID() == id:
		defer h.Close()
		if err := m.engine.Remove(ctx, h, routing); err != nil {
			return err
		}
		log.Info("namespace outlived its teardown; the pod's capture is removed")
	case err == nil:
		h.Close()
		log.Debug("path names another namespace now; leaving it alone", "netns_id", h.ID().String(), "recorded_netns_id", id.String())
	case namespaceGone(err):
		log.Debug("namespace gone with its capture", "error", err)
	default:
		return err
	}
	return nil
}

// leftoverHolds reports whether another of uid's leftovers still names
// namespace id, which then stays uid's.
func (m *Manager) leftoverHolds(uid string, id netns.ID) bool {
	rest, err := m.store.LeftoversOf(uid)
	if err != nil {
		return true // keep the claim; the next pass settles it
	}
	for _, l := range rest {
		if lid, _ := l.Record.NamespaceID(); lid == id {
			return true
		}
	}
	return false
}
