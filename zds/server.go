// Package zds serves ZDS, the protocol through which a node proxy (stock
// ztunnel in its in-pod mode) receives the network namespace of every
// captured pod: the proxy connects to a Unix SOCK_SEQPACKET socket, says
// hello, gets every enrolled pod's namespace fd (SCM_RIGHTS) followed by a
// snapshot marker, then every add and delete as it happens, and acks each
// message in order.
//
// The Server never blocks its callers on a proxy: PodAdded and PodRemoved
// queue work for per-connection goroutines and return. A NACK is retried
// with backoff; a connection that stops acking is dropped (the proxy
// reconnects and gets a fresh snapshot).
package zds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/peercred"
	"github.com/nftredir/nftredir/netns"
)

// Defaults: the timings of Istio's node agent, which ztunnel is tuned
// against.
const (
	DefaultHelloTimeout      = 5 * time.Second
	DefaultAckTimeout        = 5 * time.Second
	DefaultKeepaliveInterval = 5 * time.Second
	DefaultRetryBackoff      = 500 * time.Millisecond
	DefaultMaxRetryBackoff   = 30 * time.Second
	DefaultAcceptInterval    = 200 * time.Millisecond
	// DefaultMaxDelAttempts: with the default backoff, about two minutes
	// of retries.
	DefaultMaxDelAttempts = 8
	// DefaultRefusalLogInterval keeps a caller refused in a loop from
	// flooding the log.
	DefaultRefusalLogInterval = 10 * time.Second
	// DefaultProxyWait covers a node proxy's reconnection (stock ztunnel
	// was measured reconnecting 0.2-0.4 s after the daemon's restart) and
	// stays within a runtime's NRI request timeout (2 s by default).
	DefaultProxyWait = time.Second
)

// Errors a PodAddedWait caller can tell apart.
var (
	// ErrNoProxy: no proxy is connected, so nobody can ack. The pod is in
	// the snapshot the next proxy to connect receives.
	ErrNoProxy = errors.New("no node proxy connected over ZDS")
	// ErrDisconnected: the connection that was to ack went away first.
	ErrDisconnected = errors.New("node proxy disconnected before acking")
	// ErrSuperseded: the pod was removed (or re-added) before the ack.
	ErrSuperseded = errors.New("superseded by a later change of the pod")
	// ErrClosed: the server is shut down.
	ErrClosed = errors.New("zds server closed")
)

// NackError is the proxy refusing a request; the server keeps retrying.
type NackError struct {
	UID     string
	Message string
}

func (e *NackError) Error() string {
	return fmt.Sprintf("node proxy refused pod %s: %s", e.UID, e.Message)
}

// Pod is what the proxy is told about an enrolled pod.
type Pod struct {
	UID            string
	Name           string
	Namespace      string
	ServiceAccount string
	// NetnsPath is opened (through the Opener) just before each send.
	NetnsPath string
	// NetnsID is the identity recorded at enrolment. A path that now
	// leads to another namespace is never sent; zero skips the check.
	NetnsID netns.ID
}

// PodSource lists every enrolled pod, for the snapshot a new connection
// receives. Callers update the source before calling PodAdded or
// PodRemoved, so a connection that registers in between sees the change
// in one or the other. An error drops the connection before anything is
// sent: an empty snapshot would make the proxy drop every pod.
type PodSource interface {
	Pods() ([]Pod, error)
}

// Opener opens a pod's namespace path safely. A capture.Engine is one:
// the daemon passes the engine its lifecycle programs namespaces with, so
// the proxy is handed only namespaces that engine vetted, and tests run
// the protocol on capturetest.Fake. Errors wrap the netns sentinels,
// which tell a namespace that is gone from one that may come back.
type Opener interface {
	Open(path string) (capture.Namespace, error)
}

var _ Opener = capture.Engine(nil)

// Config configures a Server. Zero durations take the defaults.
type Config struct {
	// Pods is the enrolled set. Required.
	Pods PodSource
	// Opener opens namespaces. Required; the daemon's capture engine.
	Opener Opener
	// Logger; the daemon passes root.Named("zds").
	Logger hclog.Logger

	HelloTimeout time.Duration
	// AckTimeout bounds each write and the wait for its ack. A connection
	// that misses it is closed: acks carry no request id, so after a late
	// ack every later one would be taken for the wrong request.
	AckTimeout time.Duration
	// KeepaliveInterval is how long a connection may be idle before a
	// short read checks that the proxy is still there.
	KeepaliveInterval time.Duration
	// RetryBackoff is the first delay after a NACK, doubling up to
	// MaxRetryBackoff.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// MaxDelAttempts bounds how often a NACKed DelWorkload is sent. A
	// removed pod is retried only while it may still matter to the
	// proxy: never once its namespace is gone, and at most this often.
	MaxDelAttempts int
	// AcceptInterval spaces accepts of allowed callers, so a proxy
	// reconnecting in a loop cannot exhaust the daemon. Refused callers
	// are not spaced: they are dropped at once, so a flood of them cannot
	// keep the real proxy waiting in the accept queue.
	AcceptInterval time.Duration

	// Allow says who besides root may connect. Whoever connects gets
	// every enrolled pod's namespace and, as the newest connection, every
	// later pod, so the zero value (root only) is the right default.
	Allow peercred.Allowlist
	// SocketGroup owns the socket (and the directory Listen creates), so
	// its members can reach it; they still need Allow. 0 is root's group.
	SocketGroup int
	// RefusalLogInterval is the least time between two log lines about
	// refused callers; the ones in between are counted in the next line.
	RefusalLogInterval time.Duration

	// Acked, if set, is called after a proxy acked an add of the pod (a
	// snapshot's included), outside the server's locks. It must not
	// block: the Kubernetes agent only queues the pod, whose annotation
	// waits for the ack.
	Acked func(uid string)

	// ProxyWait is how long PodAddedWait, once the server serves, waits
	// for a proxy to connect when none is: a node proxy that is
	// reconnecting (after its own restart, or the daemon's) takes the pod
	// in its snapshot moments later, and the caller (a sandbox being made)
	// had better wait that long than fail and be retried seconds later.
	ProxyWait time.Duration
}

func (c *Config) defaults() error {
	if c.Pods == nil {
		return errors.New("zds config: Pods is required")
	}
	if c.Opener == nil {
		return errors.New("zds config: Opener is required")
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.HelloTimeout, DefaultHelloTimeout},
		{&c.AckTimeout, DefaultAckTimeout},
		{&c.KeepaliveInterval, DefaultKeepaliveInterval},
		{&c.RetryBackoff, DefaultRetryBackoff},
		{&c.MaxRetryBackoff, DefaultMaxRetryBackoff},
		{&c.AcceptInterval, DefaultAcceptInterval},
		{&c.RefusalLogInterval, DefaultRefusalLogInterval},
		{&c.ProxyWait, DefaultProxyWait},
	} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if c.MaxDelAttempts <= 0 {
		c.MaxDelAttempts = DefaultMaxDelAttempts
	}
	if c.MaxRetryBackoff < c.RetryBackoff {
		c.MaxRetryBackoff = c.RetryBackoff
	}
	return nil
}

// Stats are counters since the server started, for metrics and status.
type Stats struct {
	// Connected is the number of proxies past hello right now.
	Connected int
	Accepted  uint64
	Acks      uint64
	Nacks     uint64
	// AckTimeouts counts connections dropped for not acking in time.
	AckTimeouts uint64
	Retries     uint64
	// ProtocolErrors counts connections dropped for a malformed or
	// unexpected message.
	ProtocolErrors uint64
	// OpenFailures counts sends skipped because the pod's namespace could
	// not be opened (or was another namespace).
	OpenFailures uint64
	// Refused counts connections closed unread because the caller is not
	// allowed (or its credentials could not be read).
	Refused uint64
}

type counters struct {
	accepted, acks, nacks, ackTimeouts, retries, protocolErrors, openFailures, refused atomic.Uint64
}

// Server is the ZDS server. Create it with NewServer, then Listen and
// Serve.
type Server struct {
	cfg     Config
	log     hclog.Logger
	stats   counters
	refusal refusalLog

	mu sync.Mutex
	// protects the following fields
	ln     *net.UnixListener
	path   string
	conns  []*conn // past hello, oldest first
	all    map[*conn]struct{}
	nextID uint64
	closed bool
	// serving: Serve accepts connections.
	serving bool

	wg sync.WaitGroup
}

// NewServer checks cfg. It opens no socket.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: cfg.Logger, all: map[*conn]struct{}{}}, nil
}

// Listen creates the socket at path (see listen for the safety checks).
func (s *Server) Listen(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.ln != nil {
		return fmt.Errorf("zds server already listens on %s", s.path)
	}
	ln, err := listen(path, s.cfg.SocketGroup)
	if err != nil {
		return err
	}
	s.ln, s.path = ln, path
	s.log.Info("listening for node proxies", "socket", path)
	return nil
}

// Serve accepts connections until ctx ends or Close is called, then closes
// every connection and returns. It returns nil on a requested stop.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln == nil {
		return errors.New("zds server: Serve before Listen")
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	s.mu.Lock()
	s.serving = true
	s.mu.Unlock()
	var last time.Time
	for {
		if wait := s.cfg.AcceptInterval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		uc, err := ln.AcceptUnix()
		if err != nil {
			last = time.Now()
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				s.Close()
				s.wg.Wait()
				return nil
			}
			s.log.Warn("accept failed", "error", err)
			continue
		}
		// Checked before anything is read or sent, and before the pacing
		// below counts the accept: a refused caller costs one getsockopt.
		cred, err := peercred.FromConn(uc)
		if err != nil || !s.cfg.Allow.Allows(cred) {
			uc.Close()
			s.stats.refused.Add(1)
			s.refusal.note(s.log, cred, err, s.cfg.RefusalLogInterval)
			continue
		}
		last = time.Now()
		s.stats.accepted.Add(1)
		c := s.newConn(uc, cred)
		if c == nil {
			uc.Close()
			continue
		}
		s.wg.Go(func() { c.run(ctx) })
	}
}

// Close stops accepting, closes every connection (failing waiters with
// ErrClosed) and removes the socket. Proxies keep their pods until they
// reconnect to the next server and get its snapshot.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ln := s.ln
	conns := make([]*conn, 0, len(s.all))
	for c := range s.all {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	var err error
	if ln != nil {
		err = ln.Close()
	}
	for _, c := range conns {
		c.shutdown(ErrClosed)
	}
	return err
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) newConn(uc *net.UnixConn, cred *peercred.Cred) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.nextID++
	c := newConn(s, uc, s.nextID)
	c.log = c.log.With("peer_pid", cred.PID, "peer_uid", cred.UID, "peer_gid", cred.GID)
	s.all[c] = struct{}{}
	return c
}

// register makes c the newest connection once it said hello.
func (s *Server) register(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns = append(s.conns, c)
	return true
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.all, c)
	s.conns = slices.DeleteFunc(s.conns, func(x *conn) bool { return x == c })
}

func (s *Server) newest() *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 {
		return nil
	}
	return s.conns[len(s.conns)-1]
}

func (s *Server) registered() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.conns)
}

// PodAdded queues an AddWorkload for the newest connection and returns at
// once. With no proxy connected there is nothing to do: the pod is in the
// snapshot the next proxy receives.
func (s *Server) PodAdded(pod Pod) {
	c := s.newest()
	if c == nil {
		s.log.Debug("no node proxy connected; the pod goes out with the next snapshot", "pod", pod.UID)
		return
	}
	c.enqueueAdd(pod, nil)
}

// PodAddedWait is PodAdded that returns once the newest connection acked
// the pod: nil on an ack, a *NackError on a NACK (retries go on in the
// background), ErrNoProxy when no proxy is connected, ErrDisconnected,
// ErrSuperseded, or ctx's error.
//
// With no proxy connected while the server serves, it waits up to
// ProxyWait for one: the pod's record is written before the call, so the
// snapshot of the proxy that connects carries it, and the ack of that
// snapshot's add is the pod's. Before Serve (the daemon's startup pass)
// it does not wait: no proxy can connect yet.
func (s *Server) PodAddedWait(ctx context.Context, pod Pod) error {
	c := s.newest()
	if c == nil {
		return s.awaitSnapshotAck(ctx, pod.UID)
	}
	done := make(chan error, 1)
	c.enqueueAdd(pod, done)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitSnapshotAck waits, while no proxy is connected, for one to connect
// and ack uid in its snapshot. The proxy's connection is followed by
// polling: a snapshot is sent once per connection, and its adds are
// never queued where a waiter could wait on them.
func (s *Server) awaitSnapshotAck(ctx context.Context, uid string) error {
	if !s.Serving() {
		return ErrNoProxy
	}
	deadline := time.NewTimer(s.cfg.ProxyWait)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	connected := false
	for {
		if c := s.newest(); c != nil {
			connected = true
			switch st := c.podState(uid); st.phase {
			case phaseAcked:
				return nil
			case phaseNacked:
				return &NackError{UID: uid, Message: st.detail}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			if connected {
				return fmt.Errorf("%w: the node proxy that connected has not acked the pod within %s", ErrDisconnected, s.cfg.ProxyWait)
			}
			return fmt.Errorf("%w (waited %s for one)", ErrNoProxy, s.cfg.ProxyWait)
		case <-tick.C:
		}
	}
}

// Serving reports whether Serve accepts connections.
func (s *Server) Serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serving && !s.closed
}

// PodRemoved queues a DelWorkload for every connection (an older proxy in
// a rolling upgrade may still hold the pod) and returns at once.
func (s *Server) PodRemoved(uid string) {
	for _, c := range s.registered() {
		c.enqueueDel(uid)
	}
}

// StateAcked is State of a pod the newest proxy holds.
const StateAcked = "acked"

// State describes where the pod stands with the newest proxy: StateAcked,
// "pending", "nacked: <message>", "netns unavailable: <error>", or "no
// proxy connected". It is meaningful for pods the PodSource lists.
func (s *Server) State(uid string) string {
	c := s.newest()
	if c == nil {
		return "no proxy connected"
	}
	return c.state(uid)
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	connected := len(s.conns)
	s.mu.Unlock()
	return Stats{
		Connected:      connected,
		Accepted:       s.stats.accepted.Load(),
		Acks:           s.stats.acks.Load(),
		Nacks:          s.stats.nacks.Load(),
		AckTimeouts:    s.stats.ackTimeouts.Load(),
		Retries:        s.stats.retries.Load(),
		ProtocolErrors: s.stats.protocolErrors.Load(),
		OpenFailures:   s.stats.openFailures.Load(),
		Refused:        s.stats.refused.Load(),
	}
}

// refusalLog rate-limits the log lines about refused callers: the first
// refusal is logged at once, later ones at most once per interval, each
// line counting the refusals it stands for.
type refusalLog struct {
	mu sync.Mutex
	// protects the following fields
	last       time.Time
	suppressed int
}

func (r *refusalLog) note(log hclog.Logger, cred *peercred.Cred, err error, interval time.Duration) {
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < interval {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	args := []any{"also_refused_since_last_line", suppressed}
	if err != nil {
		args = append(args, "error", err)
	} else {
		args = append(args, "peer_pid", cred.PID, "peer_uid", cred.UID, "peer_gid", cred.GID, "peer_groups", fmt.Sprint(cred.Groups))
	}
	log.Warn("refused a ZDS connection: the caller is not allowed (root, --zds-allow-uid, --zds-allow-gid); nothing was sent", args...)
}
