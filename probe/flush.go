package probe

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/nft"
)

// elemIndex is an element map indexed by owner too, so that a pod's own
// elements are found without walking the whole set.
type elemIndex struct {
	of map[netip.Addr]string
	by map[string]map[netip.Addr]struct{}
}

func newElemIndex(elems map[netip.Addr]string) *elemIndex {
	x := &elemIndex{of: map[netip.Addr]string{}, by: map[string]map[netip.Addr]struct{}{}}
	for a, owner := range elems {
		x.set(a, owner)
	}
	return x
}

// set makes owner the owner of a; "" removes a.
func (x *elemIndex) set(a netip.Addr, owner string) {
	if old, ok := x.of[a]; ok {
		delete(x.by[old], a)
		if len(x.by[old]) == 0 {
			delete(x.by, old)
		}
	}
	if owner == "" {
		delete(x.of, a)
		return
	}
	x.of[a] = owner
	if x.by[owner] == nil {
		x.by[owner] = map[netip.Addr]struct{}{}
	}
	x.by[owner][a] = struct{}{}
}

// ownedBy is uid's elements, in the form intent.afterAdd takes.
func (x *elemIndex) ownedBy(uid string) map[netip.Addr]string {
	out := make(map[netip.Addr]string, len(x.by[uid]))
	for a := range x.by[uid] {
		out[a] = uid
	}
	return out
}

// round is one batch as its waiters see it: done is closed once the batch
// carrying their changes committed, or failed with err.
type round struct {
	done chan struct{}
	err  error
}

func (r *round) finish(err error) {
	if r == nil {
		return
	}
	r.err = err
	close(r.done)
}

func (r *round) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// counters are for tests and benchmarks: how often the kernel was read,
// how many batches were sent, and how many element changes they carried.
type counters struct {
	reads, batches, elements atomic.Int64
	// repairs counts batches that restored what someone else changed
	// (see Repairs); the daemon exports it.
	repairs atomic.Int64
}

// mode is how a batch is planned.
type mode int

const (
	// modeDelta sends the pending element changes, reading the kernel
	// first only when the Manager's picture cannot be trusted.
	modeDelta mode = iota
	// modeRead reads the kernel first and repairs the skeleton.
	modeRead
	// modeExact reads the kernel and makes the sets exactly the intent.
	modeExact
)

// changeLocked records ch in want and marks what differs as dirty. It
// reports whether anything changed.
func (m *Manager) changeLocked(ch changes) bool {
	changed := false
	for a, owner := range ch {
		if cur, ok := m.want.of[a]; (owner == "" && !ok) || (ok && cur == owner) {
			continue
		}
		m.want.set(a, owner)
		m.dirty[a] = struct{}{}
		changed = true
	}
	return changed
}

// committedLocked: the kernel holds every one of addrs owned by uid, as far
// as the Manager knows, so an Add that changed nothing need not wait.
func (m *Manager) committedLocked(uid string, addrs []netip.Addr) bool {
	if !m.synced {
		return false
	}
	for _, a := range addrs {
		if _, d := m.dirty[a]; d || m.applied[a] != uid {
			return false
		}
	}
	return true
}

// roundLocked is the round that will carry the changes made so far, and
// makes sure a sender will run it.
func (m *Manager) roundLocked() *round {
	if m.next == nil {
		m.next = &round{done: make(chan struct{})}
	}
	if !m.sending {
		m.sending = true
		go m.send()
	}
	return m.next
}

// send runs rounds until none is waiting. Everything that piles up while a
// batch is in flight goes in the next one.
func (m *Manager) send() {
	for {
		m.kmu.Lock()
		m.mu.Lock()
		if m.next == nil {
			m.sending = false
			m.mu.Unlock()
			m.kmu.Unlock()
			return
		}
		m.mu.Unlock()
		if err := m.commit("update", modeDelta); err != nil {
			// Removals have nobody to report to; the changes stay pending.
			m.log.Warn("cannot update the node probe table; the next change or reconcile pass retries", "error", err)
		}
		m.unlockKernel()
	}
}

// exclusive runs prep under mu, then one batch in mode md, for Ensure and
// Reconcile. It also carries whatever changes are pending.
func (m *Manager) exclusive(ctx context.Context, what string, md mode, prep ...func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.kmu.Lock()
	defer m.unlockKernel()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	for _, f := range prep {
		f()
	}
	m.mu.Unlock()
	return m.commit(what, md)
}

// sent is what a batch carries, for bookkeeping once the kernel answers:
// element changes (owner, or "" for gone) and the content of recreated
// sets.
type sent struct {
	ch    changes
	seeds map[string]map[netip.Addr]string
}

// commit plans and sends one batch and settles the pending round with its
// outcome. A batch the kernel refuses (the table changed under the
// Manager) is planned again once from a fresh reading. kmu must be held;
// mu is not held while the kernel works, so calls keep queueing changes.
func (m *Manager) commit(what string, md mode) (err error) {
	m.mu.Lock()
	r := m.next
	m.next = nil
	read := md != modeDelta || !m.synced
	if !read && len(m.dirty) == 0 {
		m.mu.Unlock()
		r.finish(nil)
		return nil
	}
	m.busy = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.busy = false
		if err != nil {
			m.synced = false
		}
		m.mu.Unlock()
		r.finish(err)
	}()
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		c, err := m.connLocked()
		if err != nil {
			return err
		}
		var l *nft.Live
		damaged := false
		if read {
			m.stats.reads.Add(1)
			if l, err = readLive(c, m.kfd, m.rs); err != nil {
				m.dropConnLocked()
				return fmt.Errorf("%s: read node table in %s: %w", what, m.path, err)
			}
		}
		m.mu.Lock()
		if l != nil && m.installed {
			// Once the table was ours, a skeleton out of place or
			// elements other than those committed were changed behind
			// the Manager's back: a flush of the ruleset, a firewall
			// reload, an operator.
			damaged = len(l.Problems(&m.rs.Table)) > 0 || !maps.Equal(l.Elems, m.applied)
		}
		b, s := m.planLocked(l, md == modeExact)
		m.mu.Unlock()
		if b.Empty() {
			m.mu.Lock()
			m.synced, m.installed = true, true
			m.mu.Unlock()
			return nil
		}
		if m.beforeSend != nil {
			m.beforeSend()
		}
		m.stats.batches.Add(1)
		m.stats.elements.Add(int64(b.elemChanges))
		err = b.Queue(c)
		if err == nil {
			err = c.Flush()
		}
		m.mu.Lock()
		if err == nil {
			m.appliedLocked(s)
			m.synced, m.installed = true, true
			m.mu.Unlock()
			if damaged {
				m.stats.repairs.Add(1)
				m.log.Warn("node probe table was changed by someone else; restored", "op", what, "netns", m.path)
			}
			b.log(m.log.With("op", what, "netns", m.path))
			return nil
		}
		m.failedLocked(s)
		m.mu.Unlock()
		// A fresh connection for the retry: v0.3.0 keeps a failed batch's
		// error on the connection forever.
		m.dropConnLocked()
		read = true
		lastErr = err
	}
	return fmt.Errorf("%s: node table in %s: %w", what, m.path, lastErr)
}

// planLocked builds the batch from the dirty addresses. With a reading of
// the kernel (l), the Manager's picture is first realigned with it, the
// skeleton is repaired, and recreated sets are seeded from the intent;
// exact also makes want exactly the intent. Without one, only elements
// are sent, against what the Manager committed.
func (m *Manager) planLocked(l *nft.Live, exact bool) (*batch, *sent) {
	s := &sent{ch: changes{}, seeds: map[string]map[netip.Addr]string{}}
	if l != nil {
		m.resyncLocked(l)
		if exact {
			m.changeLocked(m.intent.exact(m.want.of))
		}
		for _, set := range m.rs.Sets {
			if l.SetOK(set.Name) {
				continue
			}
			seed := m.intent.seed(set.Name)
			for a := range m.want.of {
				if setFor(a) == set.Name {
					m.want.set(a, "")
					delete(m.dirty, a)
				}
			}
			for a, owner := range seed {
				m.want.set(a, owner)
			}
			s.seeds[set.Name] = seed
		}
	}
	for a := range m.dirty {
		s.ch[a] = m.want.of[a]
	}
	clear(m.dirty)
	if l != nil {
		return plan(l, m.rs, s.ch, func(set string) map[netip.Addr]string { return s.seeds[set] }), s
	}
	b := &batch{Batch: nft.Elements(&m.rs.Table)}
	b.elems(s.ch, m.applied, func(string) bool { return true })
	return b, s
}

// resyncLocked takes the kernel's elements as applied, and as wanted for
// every address no call has changed since: what the kernel holds is what
// the next calls are planned against, as when every call read it.
func (m *Manager) resyncLocked(l *nft.Live) {
	m.applied = l.Elems
	want := maps.Clone(l.Elems)
	for a := range m.dirty {
		if owner, ok := m.want.of[a]; ok {
			want[a] = owner
		} else {
			delete(want, a)
		}
	}
	m.want = newElemIndex(want)
}

// appliedLocked records a committed batch.
func (m *Manager) appliedLocked(s *sent) {
	for set, seed := range s.seeds {
		for a := range m.applied {
			if setFor(a) == set {
				delete(m.applied, a)
			}
		}
		maps.Copy(m.applied, seed)
	}
	for a, owner := range s.ch {
		if owner == "" {
			delete(m.applied, a)
		} else {
			m.applied[a] = owner
		}
	}
}

// failedLocked puts a refused batch's changes back in the queue; the next
// batch reads the kernel first.
func (m *Manager) failedLocked(s *sent) {
	for a := range s.ch {
		m.dirty[a] = struct{}{}
	}
	m.synced = false
}

// connLocked is the kept connection, opened if needed. kmu must be held.
func (m *Manager) connLocked() (*nftables.Conn, error) {
	if m.kc == nil {
		c, fd, end, err := m.dial()
		if err != nil {
			return nil, err
		}
		m.kc, m.kfd, m.kend = c, fd, end
	}
	m.lastUse = time.Now()
	return m.kc, nil
}

// dropConnLocked closes the connection now. Closing after a deletion
// waits for a grace period; this is for failures and Uninstall.
func (m *Manager) dropConnLocked() {
	if m.kend != nil {
		m.kend()
		m.kc, m.kend = nil, nil
	}
}

// unlockKernel releases kmu. The connection stays for connLinger, or is
// closed now once the Manager is closed; the closing happens outside the
// lock, since it may wait for a grace period.
func (m *Manager) unlockKernel() {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	var end func()
	switch {
	case m.kc == nil:
	case closed:
		end = m.kend
		m.kc, m.kend = nil, nil
		if m.idle != nil {
			m.idle.Stop()
		}
	case m.idle == nil:
		m.idle = time.AfterFunc(connLinger, m.closeIdle)
	default:
		m.idle.Reset(connLinger)
	}
	m.kmu.Unlock()
	if end != nil {
		end()
	}
}

// closeIdle closes the connection if nobody used it for connLinger; a use
// since then has reset the timer.
func (m *Manager) closeIdle() {
	m.kmu.Lock()
	var end func()
	if m.kc != nil && time.Since(m.lastUse) >= connLinger {
		end = m.kend
		m.kc, m.kend = nil, nil
	}
	m.kmu.Unlock()
	if end != nil {
		end()
	}
}
