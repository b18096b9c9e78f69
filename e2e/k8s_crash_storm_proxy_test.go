package e2e

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/testkit/zdstest"
)

// stormProxy is the crash storm's node proxy: a ZDS peer that acks every
// request and holds what ztunnel holds, the pods of its latest snapshot
// and every add and delete since, each with the namespace fd it was
// handed. It reconnects whenever the connection ends (the daemon killed,
// or flap), as ztunnel redials; until a new snapshot is complete it keeps
// what it had.
type stormProxy struct {
	path string
	t    *testing.T
	stop chan struct{}
	done chan struct{}

	mu sync.Mutex
	// protects the following fields
	peer *zdstest.Peer
	// since is when the current connection said hello; live once its
	// snapshot is complete.
	since time.Time
	live  bool
	held  map[string]proxyEntry
	// snap is the snapshot being received; snapSeen counts how often
	// each pod came in it.
	snap      map[string]proxyEntry
	snapSeen  map[string]int
	received  int
	holdUntil time.Time
	connects  int
	// twice names pods a snapshot carried more than once, since the last
	// look.
	twice []string
}

// proxyEntry is a pod the proxy holds: the namespace fd it was handed,
// and that namespace's identity.
type proxyEntry struct {
	fd       int
	dev, ino uint64
}

func startStormProxy(t *testing.T, path string) *stormProxy {
	p := &stormProxy{path: path, t: t, stop: make(chan struct{}), done: make(chan struct{}), held: map[string]proxyEntry{}}
	go p.run()
	t.Cleanup(func() {
		close(p.stop)
		p.mu.Lock()
		if p.peer != nil {
			p.peer.Close()
		}
		p.mu.Unlock()
		<-p.done
		for _, e := range p.held {
			unix.Close(e.fd)
		}
		for _, e := range p.snap {
			unix.Close(e.fd)
		}
	})
	return p
}

func (p *stormProxy) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

func (p *stormProxy) run() {
	defer close(p.done)
	for !p.stopped() {
		p.mu.Lock()
		hold := time.Until(p.holdUntil)
		p.mu.Unlock()
		if hold > 0 {
			time.Sleep(min(hold, 20*time.Millisecond))
			continue
		}
		peer, err := zdstest.Connect(p.t, p.path)
		if err != nil {
			// The daemon is down, or not listening yet.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		p.serve(peer)
		peer.Close()
		p.mu.Lock()
		if p.peer == peer {
			p.peer = nil
		}
		p.live = false
		for _, e := range p.snap {
			unix.Close(e.fd)
		}
		p.snap = nil
		p.mu.Unlock()
	}
}

// serve says hello and acks every request until the connection ends.
func (p *stormProxy) serve(peer *zdstest.Peer) {
	if err := peer.Write(zdstest.HelloMsg(1)); err != nil {
		return
	}
	p.mu.Lock()
	p.peer, p.since, p.live = peer, time.Now(), false
	p.snap, p.snapSeen = map[string]proxyEntry{}, map[string]int{}
	p.connects++
	p.mu.Unlock()
	for !p.stopped() {
		r, err := peer.Recv(200 * time.Millisecond)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return
		}
		p.apply(r)
		if err := peer.Write(zdstest.AckMsg("")); err != nil {
			return
		}
	}
}

// apply does what ztunnel does with one request.
func (p *stormProxy) apply(r zdstest.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.received++
	switch r.Kind {
	case zdstest.Add:
		e := proxyEntry{fd: -1}
		for i, fd := range r.Fds {
			if i > 0 {
				unix.Close(fd)
				continue
			}
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil {
				e = proxyEntry{fd: fd, dev: st.Dev, ino: st.Ino}
			} else {
				unix.Close(fd)
			}
		}
		into := p.held
		if !p.live {
			into = p.snap
			p.snapSeen[r.UID]++
		}
		if old, ok := into[r.UID]; ok {
			unix.Close(old.fd)
		}
		into[r.UID] = e
	case zdstest.Keep:
		// Only in a snapshot: keep serving the pod as it is.
		if !p.live {
			p.snapSeen[r.UID]++
			if old, ok := p.held[r.UID]; ok {
				if prev, ok := p.snap[r.UID]; ok {
					unix.Close(prev.fd)
				}
				p.snap[r.UID] = old
				delete(p.held, r.UID)
			}
		}
	case zdstest.Del:
		for _, m := range []map[string]proxyEntry{p.held, p.snap} {
			if e, ok := m[r.UID]; ok {
				unix.Close(e.fd)
				delete(m, r.UID)
			}
		}
	case zdstest.SnapshotSent:
		// Every pod the snapshot did not name is dropped.
		for _, e := range p.held {
			unix.Close(e.fd)
		}
		p.held, p.snap, p.live = p.snap, nil, true
		for uid, n := range p.snapSeen {
			if n > 1 {
				p.twice = append(p.twice, fmt.Sprintf("%s (%d times)", uid, n))
			}
		}
		p.snapSeen = nil
	}
}

// flap hangs up, as a restarting proxy does, and redials after hold.
func (p *stormProxy) flap(hold time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdUntil = time.Now().Add(hold)
	if p.peer != nil {
		p.peer.Close()
	}
}

// proxyView is what the proxy holds, without the fds.
type proxyView struct {
	// live: connected, with its snapshot complete, since.
	live     bool
	since    time.Time
	held     map[string]proxyEntry
	received int
	twice    []string
}

// look returns what the proxy holds; with drain, the pods snapshots
// carried twice are handed over once.
func (p *stormProxy) look(drain bool) proxyView {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := proxyView{live: p.live && p.peer != nil, since: p.since, held: map[string]proxyEntry{}, received: p.received, twice: slices.Clone(p.twice)}
	for uid, e := range p.held {
		v.held[uid] = proxyEntry{fd: -1, dev: e.dev, ino: e.ino}
	}
	if drain {
		p.twice = nil
	}
	return v
}

// connections is how many connections the proxy made.
func (p *stormProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connects
}
