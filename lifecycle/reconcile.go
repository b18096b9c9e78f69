package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// ReconcileResult counts what one reconcile pass did.
type ReconcileResult struct {
	InSync   int // already matched their record
	Repaired int // table or routing re-applied
	Dropped  int // namespace gone or replaced: record removed, nothing programmed
	Failed   int // could not be checked or repaired; retried next pass
	Released int // an interrupted RemovePod finished
}

type outcome int

const (
	outcomeNone outcome = iota // record vanished before its turn
	outcomeInSync
	outcomeRepaired
	outcomeDropped
	outcomeFailed
	outcomeReleased
)

// Reconcile checks every record against its live namespace: re-applies
// drifted or missing state and drops records whose namespace is gone or
// replaced. Each pod is handled under its lock, several pods at a time.
// Per-pod failures are logged and counted, not returned; the error is for
// a state directory that cannot be read at all.
func (m *Manager) Reconcile(ctx context.Context) (ReconcileResult, error) {
	var res ReconcileResult
	start := time.Now()
	records, err := m.store.List()
	if err != nil {
		return res, fmt.Errorf("reconcile: %w", err)
	}
	jobs := make(chan string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range min(m.workers, len(records)) {
		wg.Go(func() {
			for uid := range jobs {
				o := m.reconcileOne(ctx, uid)
				mu.Lock()
				switch o {
				case outcomeInSync:
					res.InSync++
				case outcomeRepaired:
					res.Repaired++
				case outcomeDropped:
					res.Dropped++
				case outcomeFailed:
					res.Failed++
				case outcomeReleased:
					res.Released++
				}
				mu.Unlock()
			}
		})
	}
	for _, r := range records {
		jobs <- r.PodUID
	}
	close(jobs)
	wg.Wait()
	// Namespaces left for teardown that outlived their grace, after a
	// restart too; the timer takes the ones not yet due.
	next, failed := m.cleanLeftovers(ctx, time.Now())
	res.Failed += failed
	m.rescheduleAfter(next, failed)
	m.reconcileProbe(ctx)
	level := hclog.Debug
	if res.Repaired+res.Dropped+res.Failed+res.Released > 0 {
		level = hclog.Info
	}
	if m.onReconcile != nil {
		m.onReconcile(res, time.Since(start))
	}
	m.log.Log(level, "reconcile done", "pods", len(records), "in_sync", res.InSync, "repaired", res.Repaired, "dropped", res.Dropped, "failed", res.Failed, "released", res.Released)
	return res, nil
}

func (m *Manager) reconcileOne(ctx context.Context, uid string) outcome {
	log := m.log.With("pod", uid)
	unlock, err := m.locks.lock(ctx, uid)
	if err != nil {
		log.Warn("reconcile skipped the pod", "error", err)
		return outcomeFailed
	}
	defer unlock()
	// Re-read under the lock: the pod may have been released or moved
	// since the listing.
	rec, err := m.store.Get(uid)
	if err != nil {
		log.Warn("reconcile cannot read the record", "error", err)
		return outcomeFailed
	}
	if rec == nil {
		return outcomeNone
	}
	log = log.With("netns", rec.NetnsPath)
	if rec.Removing {
		return m.reconcileRemoving(ctx, log, rec)
	}
	// A move that crashed before cleaning up the namespace left behind.
	m.finishLeaving(log, rec)
	id, _ := rec.NamespaceID()
	if cur, ok := m.owners.claim(id, uid, ""); !ok {
		return m.drop(ctx, log, rec, fmt.Sprintf("namespace %s is enrolled by pod %s", id, cur))
	}
	h, reason, err := m.openRecorded(rec)
	if err != nil {
		log.Warn("reconcile cannot open the namespace", "error", err)
		return outcomeFailed
	}
	if h == nil {
		return m.drop(ctx, log, rec, reason)
	}
	defer h.Close()
	live, err := m.inspectHandle(ctx, h, rec)
	if err != nil {
		log.Warn("reconcile cannot inspect the namespace", "error", err)
		return outcomeFailed
	}
	if live.inSync() {
		return outcomeInSync
	}
	log.Info("repairing", "detail", live.detail)
	if err := m.repair(ctx, h, rec); err != nil {
		log.Error("repair failed; retrying next pass", "error", err)
		return outcomeFailed
	}
	return outcomeRepaired
}

func (m *Manager) repair(ctx context.Context, h capture.Namespace, rec *state.Record) error {
	rs, err := rec.Ruleset()
	if err != nil {
		return err
	}
	if _, err := h.Apply(ctx, rs, rec.Routing.Netns()); err != nil {
		return err
	}
	rec.UpdatedAt = m.now()
	if err := m.store.Put(rec); err != nil {
		// The kernel matches the record's intent; only the timestamp is
		// stale, which is not worth failing the repair for.
		m.log.Warn("cannot update the record's timestamp", "pod", rec.PodUID, "error", err)
	}
	return nil
}

// drop removes a record whose namespace is no longer the one enrolled.
// Nothing is programmed anywhere: the path may now lead to a namespace
// that is not this pod's.
func (m *Manager) drop(ctx context.Context, log hclog.Logger, rec *state.Record, reason string) outcome {
	defer m.lockProbe()()
	if err := m.store.Delete(rec.PodUID); err != nil {
		log.Error("cannot drop the record", "error", err)
		return outcomeFailed
	}
	if id, err := rec.NamespaceID(); err == nil {
		m.owners.release(id, rec.PodUID)
	}
	m.released(ctx, log, rec.PodUID)
	m.watch.Publish(nftredirv1.EventType_EVENT_TYPE_REMOVED, podProto(rec))
	log.Info("record dropped", "reason", reason)
	return outcomeDropped
}

// reconcileRemoving finishes a RemovePod that recorded its intent but did
// not complete: the caller asked for the pod to go, so its capture is
// released rather than restored.
func (m *Manager) reconcileRemoving(ctx context.Context, log hclog.Logger, rec *state.Record) outcome {
	defer m.lockProbe()()
	if err := m.finishRemove(ctx, rec); err != nil {
		log.Error("cannot finish an interrupted RemovePod; retrying next pass", "error", err)
		return outcomeFailed
	}
	return outcomeReleased
}
