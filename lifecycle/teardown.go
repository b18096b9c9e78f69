package lifecycle

import (
	"context"
	"slices"
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
	moved, err := m.store.LeaveForTeardown(uid, m.now())
	if !moved {
		return err
	}
	// Moved but perhaps not durably: the pod is released either way,
	// and a repeated call would find no record to tell anyone about.
	m.released(ctx, log, uid)
	m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
	m.scheduleTeardowns(m.teardownGrace)
	if err != nil {
		return err
	}
	log.Info("pod released; its capture goes with the namespace", "grace", m.teardownGrace)
	return nil
}

// scheduleTeardowns makes sure a cleanup pass runs within after. One timer
// serves all leftovers: a pass reschedules itself for the next one due.
func (m *Manager) scheduleTeardowns(after time.Duration) {
	m.teardownMu.Lock()
	defer m.teardownMu.Unlock()
	if m.teardownStopped {
		return
	}
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

// StopTeardowns stops the background cleanup of namespaces left for
// teardown, for a daemon that is stopping. Nothing is lost: the leftovers
// are durable, and the next start's reconcile settles the ones due.
func (m *Manager) StopTeardowns() {
	m.teardownMu.Lock()
	defer m.teardownMu.Unlock()
	m.teardownStopped = true
	if m.teardownTimer != nil {
		m.teardownTimer.Stop()
		m.teardownTimer = nil
	}
}

func (m *Manager) runTeardowns() {
	m.teardownMu.Lock()
	m.teardownTimer = nil
	m.teardownMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	m.rescheduleAfter(m.cleanLeftovers(ctx, time.Now()))
}

// rescheduleAfter sets the timer after a cleanup pass: for the next
// leftover due, or, when some could not be settled, for a retry a grace
// from now, so that a node with no periodic reconcile retries too.
func (m *Manager) rescheduleAfter(next time.Time, failed int) {
	if failed > 0 && (next.IsZero() || time.Until(next) > m.teardownGrace) {
		next = time.Now().Add(m.teardownGrace)
	}
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
		// A release stamped later than a grace from now was stamped
		// before the clock was set back; waiting for it could take as
		// long as the step.
		if due.After(now) && !l.ReleasedAt.After(now.Add(m.teardownGrace)) {
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

// settleLeftovers settles uid's leftovers now, grace or not, those of
// namespace path netnsPath only when it is set: a RemovePod without
// namespace_teardown means the caller wants the namespace clean. The
// caller holds uid's lock.
func (m *Manager) settleLeftovers(ctx context.Context, uid, netnsPath string) error {
	all, err := m.store.LeftoversOf(uid)
	if err != nil {
		return err
	}
	log := m.log.With("pod", uid)
	for _, l := range all {
		if netnsPath != "" && l.Record.NetnsPath != netnsPath {
			continue
		}
		if err := m.settleLeftover(ctx, log.With("netns", l.Record.NetnsPath), l); err != nil {
			return err
		}
	}
	return nil
}

// settleLeftover removes a released pod's capture from the namespace it
// was left in (and from one it was moving out of), if that namespace
// outlived its teardown, and forgets the leftover. It leaves the kernel
// alone where the pod enrolled again (the table is the new enrolment's),
// where the path now leads elsewhere, and where another pod's table is.
// The caller holds the pod's lock.
func (m *Manager) settleLeftover(ctx context.Context, log hclog.Logger, l state.Leftover) error {
	rec := l.Record
	uid := rec.PodUID
	// The listing may predate this lock: another pass or a RemovePod
	// may have settled it since, and released what it held.
	if pending, err := m.leftoverPending(uid, l.Path); err != nil || !pending {
		return err
	}
	cur, err := m.store.Get(uid)
	if err != nil {
		return err
	}
	id, _ := rec.NamespaceID()
	places := []leftPlace{{rec.NetnsPath, id, rec.Routing.Netns(), log}}
	if lv := rec.Leaving; lv != nil {
		leftID, _ := netns.ParseID(lv.NetnsID)
		places = append(places, leftPlace{lv.NetnsPath, leftID, lv.Routing.Netns(), log.With("old_netns", lv.NetnsPath)})
	}
	for _, p := range places {
		if cur != nil && sameNamespace(cur, p.id) {
			p.log.Debug("namespace enrolled again by the pod; its capture is the new enrolment's")
			continue
		}
		if err := m.removeLeftCapture(ctx, uid, p); err != nil {
			return err
		}
	}
	if err := m.store.DropLeftover(l.Path); err != nil {
		return err
	}
	for _, p := range places {
		m.dropClaim(uid, cur, p.id)
	}
	log.Info("namespace left for teardown settled", "released_at", l.ReleasedAt)
	return nil
}

// leftPlace is a namespace a leftover may have left capture in.
type leftPlace struct {
	path    string
	id      netns.ID
	routing netns.Routing
	log     hclog.Logger
}

func sameNamespace(rec *state.Record, id netns.ID) bool {
	rid, err := rec.NamespaceID()
	return err == nil && rid == id
}

// removeLeftCapture removes uid's capture from p if its path still leads
// to the namespace the pod was released from, as a quarantined record's is
// removed: only a table carrying uid, under a claim for uid.
func (m *Manager) removeLeftCapture(ctx context.Context, uid string, p leftPlace) error {
	h, err := m.open(p.path)
	switch {
	case err == nil && h.ID() == p.id:
		defer h.Close()
		return m.releaseIfOwned(ctx, p.log, h, uid, p.id, p.routing)
	case err == nil:
		h.Close()
		p.log.Debug("path names another namespace now; leaving it alone", "netns_id", h.ID().String(), "recorded_netns_id", p.id.String())
	case namespaceGone(err):
		p.log.Debug("namespace gone with its capture", "error", err)
	default:
		return err
	}
	return nil
}

// leftoverPending reports whether the leftover at path is still there.
func (m *Manager) leftoverPending(uid, path string) (bool, error) {
	rest, err := m.store.LeftoversOf(uid)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(rest, func(l state.Leftover) bool { return l.Path == path }), nil
}

// dropClaim gives up uid's claim on namespace id unless uid still holds
// it for a reason (holds).
func (m *Manager) dropClaim(uid string, cur *state.Record, id netns.ID) {
	if !m.holds(uid, cur, id) {
		m.owners.release(id, uid)
	}
}

// holds reports whether uid still has a reason to own namespace id: its
// record (cur) names it or is moving out of it, or another of its
// leftovers does. When that cannot be read it says yes: a claim kept is
// settled by the next pass, one dropped early could hand the namespace to
// a pod whose rules a cleanup then removes.
func (m *Manager) holds(uid string, cur *state.Record, id netns.ID) bool {
	names := func(r *state.Record) bool {
		if sameNamespace(r, id) {
			return true
		}
		lid, err := netns.ParseID(leavingID(r))
		return err == nil && lid == id
	}
	if cur != nil && names(cur) {
		return true
	}
	rest, err := m.store.LeftoversOf(uid)
	if err != nil {
		return true
	}
	return slices.ContainsFunc(rest, func(l state.Leftover) bool { return names(l.Record) })
}

func leavingID(r *state.Record) string {
	if r.Leaving == nil {
		return ""
	}
	return r.Leaving.NetnsID
}
