package server

import (
	"context"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/peer"
)

// Limits bound what callers can make the daemon hold: connections and
// watches, in total and per caller uid (from SO_PEERCRED, root included:
// the limits are about memory, not trust). Zero fields take the defaults
// below; a negative field means no limit.
type Limits struct {
	// MaxConnections bounds open API connections; more are closed at
	// accept, before a byte is read. Zero: 256.
	MaxConnections int
	// MaxConnectionsPerUID bounds one uid's open connections. Zero: 64.
	MaxConnectionsPerUID int
	// MaxWatchers bounds open WatchPods streams; more fail with
	// ResourceExhausted. Zero: 128.
	MaxWatchers int
	// MaxWatchersPerUID bounds one uid's open WatchPods streams. Zero: 16.
	MaxWatchersPerUID int
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxConnections, 256)
	def(&l.MaxConnectionsPerUID, 64)
	def(&l.MaxWatchers, 128)
	def(&l.MaxWatchersPerUID, 16)
	return l
}

// over reports whether n more would exceed limit (negative: none).
func over(n, limit int) bool { return limit >= 0 && n > limit }

// noUID keys callers whose uid is unknown (not a Unix socket).
const noUID = ^uint64(0)

// counter counts holders in total and per uid against two limits, and
// frees memory after many of them left.
type counter struct {
	total, perUID int
	freer         memFreer
	mu            sync.Mutex
	// protects the following fields
	n     int
	byUID map[uint64]int
}

func newCounter(total, perUID int) *counter {
	return &counter{total: total, perUID: perUID, byUID: map[uint64]int{}}
}

// take counts one more for uid, or says which limit it would exceed.
func (c *counter) take(uid uint64) (ok bool, which string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if over(c.n+1, c.total) {
		return false, fmt.Sprintf("the daemon's limit of %d", c.total)
	}
	if over(c.byUID[uid]+1, c.perUID) {
		return false, fmt.Sprintf("the limit of %d per caller uid", c.perUID)
	}
	c.n++
	c.byUID[uid]++
	return true, ""
}

func (c *counter) put(uid uint64) {
	c.mu.Lock()
	c.n--
	if c.byUID[uid]--; c.byUID[uid] <= 0 {
		delete(c.byUID, uid)
	}
	left := c.n
	c.mu.Unlock()
	c.freer.dropped(left)
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// callerUID is the uid the connection's SO_PEERCRED named.
func callerUID(ctx context.Context) uint64 {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(PeerInfo); ok && info.Ucred != nil {
			return uint64(info.Ucred.Uid)
		}
	}
	return noUID
}

// limitListener closes connections over the limits as they are accepted,
// so a caller cannot hold more than its share even before the HTTP/2
// preface or the auth check. A refusal is logged at most once a second,
// with the number suppressed, so a caller looping on connect cannot flood
// the log.
type limitListener struct {
	net.Listener
	conns *counter
	log   hclog.Logger

	logMu sync.Mutex
	// protects the following fields
	lastLog    time.Time
	suppressed int
}

func (s *Server) limitListener(lis net.Listener) net.Listener {
	return &limitListener{Listener: lis, conns: s.conns, log: s.log.Named("limits")}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid := connUID(c)
		if ok, which := l.conns.take(uid); !ok {
			l.refused(uid, which)
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.conns.put(uid) }}, nil
	}
}

func (l *limitListener) refused(uid uint64, which string) {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	if time.Since(l.lastLog) < time.Second {
		l.suppressed++
		return
	}
	fields := []any{"limit", which, "suppressed_since_last", l.suppressed}
	if uid != noUID {
		fields = append(fields, "peer.uid", uid)
	}
	l.log.Warn("connection refused: too many open connections", fields...)
	l.lastLog, l.suppressed = time.Now(), 0
}

// connUID reads SO_PEERCRED; the handshake reads it again for the auth
// check, from the same socket.
func connUID(c net.Conn) uint64 {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return noUID
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return noUID
	}
	uid := noUID
	raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			uid = uint64(cred.Uid)
		}
	})
	return uid
}

// limitedConn gives its slot back once, on the first Close. It embeds the
// accepted conn's interface only, so the handshake reaches the socket
// through SyscallConn.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// SyscallConn exposes the socket for SO_PEERCRED.
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("connection %T has no socket", c.Conn)
	}
	return sc.SyscallConn()
}

// watchSlot takes a WatchPods slot for the caller, or fails with
// ResourceExhausted; the returned func gives it back.
func (s *Server) watchSlot(ctx context.Context) (func(), error) {
	uid := callerUID(ctx)
	if ok, which := s.watchers.take(uid); !ok {
		return nil, tooManyWatchers(which)
	}
	return func() { s.watchers.put(uid) }, nil
}

// memFreer hands memory back to the kernel after many connections or
// watches closed. An idle daemon allocates nothing, so without this no
// garbage collection runs until the runtime's forced one two minutes
// later, and the pages return slowly after that: a burst of a thousand
// watchers left 56 MB resident for over two minutes, against 15 MB
// before. After a drop of freeStep holders from the high-water mark, one
// FreeOSMemory (a GC and a scavenge, a few ms for a heap of a few MiB)
// runs after freeDelay, coalescing the rest of the burst.
type memFreer struct {
	mu sync.Mutex
	// protects the following fields
	peak      int
	scheduled bool
}

const (
	freeStep  = 32
	freeDelay = time.Second
)

// dropped notes how many holders are left after a release.
func (m *memFreer) dropped(left int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peak = max(m.peak, left+1)
	if m.scheduled || m.peak-left < freeStep {
		return
	}
	m.scheduled = true
	time.AfterFunc(freeDelay, func() {
		debug.FreeOSMemory()
		m.mu.Lock()
		defer m.mu.Unlock()
		m.scheduled, m.peak = false, 0
	})
}
