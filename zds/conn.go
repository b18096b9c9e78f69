package zds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/netns"
	zdspb "github.com/nftredir/nftredir/proto/istio/workload/zds"
)

type opKind int

const (
	opAdd opKind = iota
	opDel
)

// op is the latest wanted change of one pod on one connection. Changes of
// a pod coalesce: a Del replaces a queued Add and the reverse, so the
// queue never holds more than one entry per pod.
type op struct {
	kind opKind
	pod  Pod // for opDel only UID is set
	// seq is the queue position: due ops go out oldest first.
	seq       uint64
	attempts  int
	notBefore time.Time
	waiters   []chan<- error
	// nsGone: for a NACKed del, the pod's namespace no longer exists.
	nsGone bool
}

type phase int

const (
	phasePending phase = iota
	phaseAcked
	phaseNacked
	phaseUnavailable
)

type podState struct {
	phase  phase
	detail string
}

func (st podState) String() string {
	switch st.phase {
	case phaseAcked:
		return StateAcked
	case phaseNacked:
		return "nacked: " + st.detail
	case phaseUnavailable:
		return "netns unavailable: " + st.detail
	}
	return "pending"
}

// conn is one proxy connection. One goroutine (run) does all reads and
// writes: acks correlate with requests only by order.
type conn struct {
	s   *Server
	uc  *net.UnixConn
	id  uint64
	log hclog.Logger

	wake      chan struct{}
	closing   chan struct{}
	closeOnce sync.Once

	mu sync.Mutex
	// protects the following fields
	pending  map[string]*op
	inflight *op
	states   map[string]podState
	// sent is what this connection last told the proxy of each pod it
	// added, so that a NACKed delete can tell whether the pod's namespace
	// is gone.
	sent map[string]Pod
	seq  uint64
	dead error
}

func newConn(s *Server, uc *net.UnixConn, id uint64) *conn {
	return &conn{
		s:       s,
		uc:      uc,
		id:      id,
		log:     s.log.With("conn", id),
		wake:    make(chan struct{}, 1),
		closing: make(chan struct{}),
		pending: map[string]*op{},
		states:  map[string]podState{},
		sent:    map[string]Pod{},
	}
}

func (c *conn) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) enqueueAdd(pod Pod, waiter chan<- error) {
	c.mu.Lock()
	if c.dead != nil {
		err := c.dead
		c.mu.Unlock()
		if waiter != nil {
			waiter <- err
		}
		return
	}
	o := c.pending[pod.UID]
	if o == nil {
		c.seq++
		o = &op{seq: c.seq}
		c.pending[pod.UID] = o
	}
	o.kind, o.pod, o.attempts, o.notBefore = opAdd, pod, 0, time.Time{}
	if waiter != nil {
		o.waiters = append(o.waiters, waiter)
	}
	c.states[pod.UID] = podState{phase: phasePending}
	c.mu.Unlock()
	c.poke()
}

func (c *conn) enqueueDel(uid string) {
	c.mu.Lock()
	if c.dead != nil {
		c.mu.Unlock()
		return
	}
	o := c.pending[uid]
	if o == nil {
		c.seq++
		o = &op{seq: c.seq}
		c.pending[uid] = o
	}
	notify(o.waiters, ErrSuperseded)
	*o = op{kind: opDel, pod: Pod{UID: uid}, seq: o.seq}
	c.states[uid] = podState{phase: phasePending}
	c.mu.Unlock()
	c.poke()
}

// notify hands each waiter its one result; the channels are buffered.
func notify(waiters []chan<- error, err error) {
	for _, w := range waiters {
		w <- err
	}
}

func (c *conn) state(uid string) string { return c.podState(uid).String() }

func (c *conn) podState(uid string) podState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.states[uid]
}

// next takes the oldest due op off the queue, or says how long until one
// is due (zero: none queued).
func (c *conn) next(now time.Time) (*op, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		best *op
		wait time.Duration
	)
	for _, o := range c.pending {
		if d := o.notBefore.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		if best == nil || o.seq < best.seq {
			best = o
		}
	}
	if best != nil {
		delete(c.pending, best.pod.UID)
		c.inflight = best
	}
	return best, wait
}

// shutdown ends the connection: queued and in-flight waiters get err, and
// the socket is closed, which unblocks run wherever it is.
func (c *conn) shutdown(err error) {
	c.closeOnce.Do(func() {
		if !errors.Is(err, ErrClosed) {
			err = fmt.Errorf("%w: %v", ErrDisconnected, err)
		}
		c.mu.Lock()
		c.dead = err
		for _, o := range c.pending {
			notify(o.waiters, err)
		}
		c.pending = map[string]*op{}
		if c.inflight != nil {
			notify(c.inflight.waiters, err)
			c.inflight.waiters = nil
		}
		c.mu.Unlock()
		close(c.closing)
		c.uc.Close()
	})
}

// run serves the connection until it fails or the server stops.
func (c *conn) run(ctx context.Context) {
	err := c.serve(ctx)
	if err == nil {
		err = ErrClosed
	}
	switch {
	case errors.Is(err, io.EOF):
		c.log.Info("node proxy disconnected")
	case errors.Is(err, ErrClosed) || (errors.Is(err, net.ErrClosed) && c.isClosing()):
		c.log.Debug("connection closed by the server")
	default:
		if errors.Is(err, errProtocol) {
			c.s.stats.protocolErrors.Add(1)
		}
		c.log.Warn("dropping node proxy connection", "error", err)
	}
	c.shutdown(err)
	c.s.forget(c)
}

func (c *conn) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

func (c *conn) serve(ctx context.Context) error {
	if err := readHello(c.uc, c.s.cfg.HelloTimeout); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	// Registered before the snapshot is read: a pod added from here on is
	// either in the snapshot or queued here, and is never missed.
	if !c.s.register(c) {
		return ErrClosed
	}
	c.log.Info("node proxy connected")
	if err := c.sendSnapshot(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	lastIO := time.Now()
	for {
		now := time.Now()
		o, wait := c.next(now)
		if o != nil {
			if err := c.process(o, false); err != nil {
				return err
			}
			lastIO = time.Now()
			continue
		}
		alive := c.s.cfg.KeepaliveInterval - now.Sub(lastIO)
		if wait == 0 || alive < wait {
			wait = alive
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-c.wake:
			case <-t.C:
			case <-c.closing:
			case <-ctx.Done():
			}
			t.Stop()
		}
		if c.isClosing() || ctx.Err() != nil {
			return nil
		}
		if time.Since(lastIO) >= c.s.cfg.KeepaliveInterval {
			if err := c.checkAlive(); err != nil {
				return err
			}
			lastIO = time.Now()
		}
	}
}

// checkAlive does a short read: the proxy never speaks unasked, so a
// timeout means alive, EOF gone, and data a protocol error.
func (c *conn) checkAlive() error {
	_, err := readPacket(c.uc, 10*time.Millisecond)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("%w: unsolicited message from the proxy", errProtocol)
}

func (c *conn) sendSnapshot() error {
	pods, err := c.s.cfg.Pods.Pods()
	if err != nil {
		return fmt.Errorf("list enrolled pods: %w", err)
	}
	slices.SortFunc(pods, func(a, b Pod) int { return cmp.Compare(a.UID, b.UID) })
	c.mu.Lock()
	for _, p := range pods {
		if _, queued := c.pending[p.UID]; !queued {
			c.states[p.UID] = podState{phase: phasePending}
		}
	}
	c.mu.Unlock()
	for _, p := range pods {
		c.mu.Lock()
		o := &op{kind: opAdd, pod: p}
		c.inflight = o
		c.mu.Unlock()
		if err := c.process(o, true); err != nil {
			return err
		}
	}
	nack, err := c.roundTrip(snapshotSentRequest(), nil)
	if err != nil {
		return err
	}
	if nack != "" {
		c.log.Warn("node proxy refused the end of the snapshot", "error", nack)
	}
	c.log.Info("snapshot sent", "pods", len(pods))
	return nil
}

// roundTrip sends one request, with the namespace ns attached when it is
// not nil, and waits for its ack. ns is closed as soon as the packet is
// written: the proxy holds its own copy from then on. Any error but
// errUnsendable ends the connection: after a failed write or a missed ack
// nothing later can be matched to its request.
func (c *conn) roundTrip(req *zdspb.WorkloadRequest, ns capture.Namespace) (string, error) {
	fd := -1
	if ns != nil {
		defer ns.Close()
		fd = ns.Fd()
	}
	data, err := encode(req)
	if err != nil {
		return "", err
	}
	timeout := c.s.cfg.AckTimeout
	err = writePacket(c.uc, data, fd, timeout)
	if ns != nil {
		ns.Close()
	}
	if err != nil {
		return "", err
	}
	nack, err := readAck(c.uc, timeout)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.s.stats.ackTimeouts.Add(1)
		return "", fmt.Errorf("no ack within %s", timeout)
	}
	if err != nil {
		return "", err
	}
	if nack == "" {
		c.s.stats.acks.Add(1)
	} else {
		c.s.stats.nacks.Add(1)
	}
	return nack, nil
}

// errIDMismatch: the pod's path now leads to another namespace.
var errIDMismatch = errors.New("path leads to another namespace than the one enrolled")

// openPod opens the pod's namespace and checks it is the enrolled one.
func (c *conn) openPod(p Pod) (capture.Namespace, error) {
	ns, err := c.s.cfg.Opener.Open(p.NetnsPath)
	if err != nil {
		return nil, err
	}
	if !p.NetnsID.IsZero() && !sameNamespace(ns.ID(), p.NetnsID) {
		id := ns.ID()
		ns.Close()
		return nil, fmt.Errorf("%s is %s, enrolled as %s: %w", p.NetnsPath, id, p.NetnsID, errIDMismatch)
	}
	return ns, nil
}

// sameNamespace compares dev:ino and, when both sides know it, the
// namespace cookie, which tells a recreated namespace with a reused inode
// from the enrolled one.
func sameNamespace(got, want netns.ID) bool {
	return got.SameFile(want) && (got.Cookie == 0 || want.Cookie == 0 || got.Cookie == want.Cookie)
}

// namespaceGone reports whether the namespace this connection last sent
// for uid no longer exists (or its path now leads elsewhere). Unknown
// pods and namespaces that cannot be checked count as present.
func (c *conn) namespaceGone(uid string) bool {
	c.mu.Lock()
	p, ok := c.sent[uid]
	c.mu.Unlock()
	if !ok || p.NetnsPath == "" {
		return false
	}
	ns, err := c.openPod(p)
	if err == nil {
		ns.Close()
		return false
	}
	return errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetns) || errors.Is(err, errIDMismatch)
}

// permanent reports whether retrying to open the namespace is pointless:
// it is gone, or is not the pod's any more. The daemon's reconcile
// releases such pods.
func permanent(err error) bool {
	return errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetns) ||
		errors.Is(err, netns.ErrHostNetns) || errors.Is(err, netns.ErrNotAbsolute) ||
		errors.Is(err, netns.ErrNoAccess) || errors.Is(err, errIDMismatch)
}

// process sends o (already taken as c.inflight) and settles it. Only
// connection-level failures are returned.
func (c *conn) process(o *op, snapshot bool) error {
	uid := o.pod.UID
	log := c.log.With("pod", uid)
	if o.attempts > 0 {
		c.s.stats.retries.Add(1)
	}
	var (
		req     *zdspb.WorkloadRequest
		ns      capture.Namespace
		openErr error
	)
	switch o.kind {
	case opDel:
		req = delRequest(uid)
	case opAdd:
		var err error
		if ns, err = c.openPod(o.pod); err != nil {
			c.s.stats.openFailures.Add(1)
			openErr = err
			if !snapshot {
				c.settle(o, log, "", err)
				return nil
			}
			// The proxy must not drop a pod it may be serving just
			// because its namespace cannot be opened right now.
			req = keepRequest(uid)
			break
		}
		req = addRequest(o.pod)
	}
	if o.kind == opAdd && openErr == nil {
		c.mu.Lock()
		c.sent[uid] = o.pod
		c.mu.Unlock()
	}
	nack, err := c.roundTrip(req, ns)
	if errors.Is(err, errUnsendable) {
		c.settle(o, log, "", err)
		return nil
	}
	if err != nil {
		return err
	}
	if o.kind == opDel && nack != "" {
		o.nsGone = c.namespaceGone(uid)
	}
	if openErr != nil {
		if nack != "" {
			log.Warn("node proxy refused to keep a pod whose namespace cannot be opened", "error", nack)
		}
		c.settle(o, log, "", openErr)
		return nil
	}
	c.settle(o, log, nack, nil)
	return nil
}

// settle records the outcome of o, tells its waiters, and queues a retry
// when one is due and no newer change of the pod is queued.
func (c *conn) settle(o *op, log hclog.Logger, nack string, failure error) {
	uid := o.pod.UID
	acked := false
	// Deferred before the unlock, so it runs after it.
	defer func() {
		if acked && c.s.cfg.Acked != nil {
			c.s.cfg.Acked(uid)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight = nil
	_, newer := c.pending[uid]
	waiters := o.waiters
	o.waiters = nil
	retry := false
	var st podState
	switch {
	case failure != nil:
		st = podState{phase: phaseUnavailable, detail: failure.Error()}
		if errors.Is(failure, errUnsendable) {
			log.Error("pod cannot be sent over ZDS", "error", failure)
		} else {
			retry = !permanent(failure)
			log.Warn("cannot open the pod's namespace for the node proxy", "error", failure, "retry", retry)
		}
		notify(waiters, fmt.Errorf("pod %s: %w", uid, failure))
	case nack != "" && o.kind == opDel && (o.nsGone || o.attempts+1 >= c.s.cfg.MaxDelAttempts):
		// Nothing is left for a retry to release, or the proxy has had
		// its chances: retrying forever would only load both sides.
		why := "the pod's namespace is gone"
		if !o.nsGone {
			why = fmt.Sprintf("refused %d times", o.attempts+1)
		}
		log.Warn("node proxy refused to delete the pod; giving up", "error", nack, "attempt", o.attempts+1, "reason", why)
		notify(waiters, &NackError{UID: uid, Message: nack})
		if !newer {
			delete(c.states, uid)
			delete(c.sent, uid)
		}
		return
	case nack != "":
		st = podState{phase: phaseNacked, detail: nack}
		retry = true
		log.Warn("node proxy refused the request; retrying", "request", o.kind, "error", nack, "attempt", o.attempts+1)
		notify(waiters, &NackError{UID: uid, Message: nack})
	default:
		st = podState{phase: phaseAcked}
		log.Debug("node proxy acked", "request", o.kind)
		notify(waiters, nil)
		acked = o.kind == opAdd
	}
	if newer {
		// A later PodAdded or PodRemoved owns the pod's state now.
		return
	}
	if o.kind == opDel && failure == nil && nack == "" {
		delete(c.states, uid)
		delete(c.sent, uid)
		return
	}
	c.states[uid] = st
	if retry && c.dead == nil {
		c.seq++
		c.pending[uid] = &op{
			kind:      o.kind,
			pod:       o.pod,
			seq:       c.seq,
			attempts:  o.attempts + 1,
			notBefore: time.Now().Add(c.backoff(o.attempts)),
		}
		c.poke()
	}
}

func (c *conn) backoff(attempts int) time.Duration {
	d := c.s.cfg.RetryBackoff
	for i := 0; i < attempts && d < c.s.cfg.MaxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, c.s.cfg.MaxRetryBackoff)
}

func (k opKind) String() string {
	if k == opDel {
		return "del"
	}
	return "add"
}
