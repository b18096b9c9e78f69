package zds_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/syncbuf"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/peercred"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/zds"
)

// source is the enrolled set as the daemon would keep it.
type source struct {
	mu   sync.Mutex
	pods map[string]zds.Pod
	err  error
}

func (s *source) Pods() ([]zds.Pod, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	var out []zds.Pod
	for _, p := range s.pods {
		out = append(out, p)
	}
	return out, nil
}

func (s *source) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *source) put(p zds.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[p.UID] = p
}

func (s *source) del(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pods, uid)
}

type fixture struct {
	t    *testing.T
	srv  *zds.Server
	src  *source
	path string
	// engine opens the namespaces; fake is the same engine when it is a
	// capturetest.Fake, nil when it is the kernel's.
	engine capture.Engine
	fake   *capturetest.Fake
}

// newFixture starts a server over a capturetest.Fake, on a socket in a
// fresh directory, with short timings so failures show quickly. It needs
// no root: the protocol is the subject, and the fds the Fake hands out
// travel over the socket as a namespace's do.
func newFixture(t *testing.T, mut func(*zds.Config)) *fixture {
	t.Helper()
	fake := capturetest.NewFake()
	return startFixture(t, fake, fake, mut)
}

// newKernelFixture is newFixture over the kernel engine and real
// namespaces, for tests of what a proxy does with the fd it receives.
func newKernelFixture(t *testing.T, mut func(*zds.Config)) *fixture {
	t.Helper()
	nstest.RequirePrivileged(t)
	guard, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	return startFixture(t, capture.NewKernel(guard, nft.NewNetlink()), nil, mut)
}

func startFixture(t *testing.T, engine capture.Engine, fake *capturetest.Fake, mut func(*zds.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, src: &source{pods: map[string]zds.Pod{}}, engine: engine, fake: fake}
	cfg := zds.Config{
		Pods:              f.src,
		Opener:            engine,
		Logger:            hclog.New(&hclog.LoggerOptions{Name: "zds", Level: hclog.Debug, Output: t.Output()}),
		AckTimeout:        3 * time.Second,
		KeepaliveInterval: time.Second,
		RetryBackoff:      20 * time.Millisecond,
		MaxRetryBackoff:   100 * time.Millisecond,
		AcceptInterval:    time.Millisecond,
		// Root's group and root alone when run as root, as the daemon's
		// defaults; otherwise the tester, so the fixture runs without root.
		SocketGroup: os.Getegid(),
		Allow:       peercred.Allowlist{UIDs: []uint32{uint32(os.Geteuid())}},
	}
	if mut != nil {
		mut(&cfg)
	}
	var err error
	f.srv, err = zds.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.path = filepath.Join(t.TempDir(), "ztunnel", "ztunnel.sock")
	if err := f.srv.Listen(f.path); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.srv.Serve(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); !f.srv.Serving(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server does not serve")
		}
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return f
}

// newPod makes a namespace for a pod and enrols it in the source, with
// the identity the daemon records at enrolment.
func (f *fixture) newPod(uid string) zds.Pod {
	f.t.Helper()
	p := zds.Pod{UID: uid, Name: "app-" + uid, Namespace: "shop", ServiceAccount: "sa-" + uid}
	if f.fake != nil {
		p.NetnsPath = "/run/netns/zds-" + uid
		f.fake.AddNamespace(p.NetnsPath)
	} else {
		p.NetnsPath = nstest.NewNetns(f.t).Path
	}
	p.NetnsID = f.netnsID(p.NetnsPath)
	f.src.put(p)
	return p
}

// waitFor polls cond until it holds; the server settles state after the
// peer's ack arrives, which the test cannot otherwise observe.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fixture) waitState(uid, want string) {
	f.t.Helper()
	waitFor(f.t, fmt.Sprintf("pod %s state %q (now %q)", uid, want, f.srv.State(uid)), func() bool {
		return strings.HasPrefix(f.srv.State(uid), want)
	})
}

func (f *fixture) waitConnected(n int) {
	f.t.Helper()
	waitFor(f.t, fmt.Sprintf("%d connected proxies", n), func() bool { return f.srv.Stats().Connected == n })
}

// netnsID is the identity the engine gives the namespace at path now.
func (f *fixture) netnsID(path string) netns.ID {
	f.t.Helper()
	ns, err := f.engine.Open(path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer ns.Close()
	return ns.ID()
}

// checkAdd checks that an add carries the pod's namespace and workload
// info. Over the kernel the fd must be a network namespace; a Fake's is a
// stand-in file, whose device and inode are the namespace's all the same.
func (f *fixture) checkAdd(r zdstest.Request, p zds.Pod) {
	t := f.t
	t.Helper()
	var got netns.ID
	if f.fake != nil {
		id, err := capturetest.FileID(r.Fds[0])
		if err != nil {
			t.Fatal(err)
		}
		got = id
	} else {
		dev, ino := zdstest.NetnsOf(t, r.Fds[0])
		got = netns.ID{Dev: dev, Ino: ino}
	}
	if !got.SameFile(p.NetnsID) {
		t.Errorf("add %s carries namespace %s, want the pod's %s", p.UID, got, p.NetnsID)
	}
	if r.Name != p.Name || r.Namespace != p.Namespace || r.ServiceAccount != p.ServiceAccount {
		t.Errorf("add %s: workload info %q/%q/%q, want %q/%q/%q", p.UID, r.Namespace, r.Name, r.ServiceAccount, p.Namespace, p.Name, p.ServiceAccount)
	}
}

// netnsFds counts this process's fds open on the namespace id.
func netnsFds(t *testing.T, id netns.ID) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc/self/fd", e.Name()), &st) == nil && st.Dev == id.Dev && st.Ino == id.Ino {
			n++
		}
	}
	return n
}

func TestSnapshotThenAddAndDel(t *testing.T) {
	f := newFixture(t, nil)
	a, b := f.newPod("pod-a"), f.newPod("pod-b")
	gone := zds.Pod{UID: "pod-c", NetnsPath: "/run/netns/nftr-never-existed"}
	f.src.put(gone)

	if got := f.srv.State(a.UID); got != "no proxy connected" {
		t.Errorf("State before any proxy = %q", got)
	}
	p := zdstest.Dial(t, f.path)
	p.Hello()
	// The snapshot goes out in uid order, one ack each.
	f.checkAdd(p.Expect(zdstest.Add, a.UID), a)
	p.Ack("")
	f.checkAdd(p.Expect(zdstest.Add, b.UID), b)
	p.Ack("")
	// A namespace that cannot be opened is kept, not dropped.
	p.Expect(zdstest.Keep, gone.UID)
	p.Ack("")
	p.Expect(zdstest.SnapshotSent, "")
	p.Ack("")
	f.waitState(a.UID, "acked")
	f.waitState(b.UID, "acked")
	f.waitState(gone.UID, "netns unavailable")

	d := f.newPod("pod-d")
	f.srv.PodAdded(d)
	f.checkAdd(p.Expect(zdstest.Add, d.UID), d)
	p.Ack("")
	f.waitState(d.UID, "acked")

	f.src.del(a.UID)
	f.srv.PodRemoved(a.UID)
	p.Expect(zdstest.Del, a.UID)
	p.Ack("")
	waitFor(t, "the del ack", func() bool { return f.srv.Stats().Acks == 6 })

	// The server kept no namespace open: only the peer holds copies, and
	// the cleanup of p.Expect closes them at the end. The Fake holds one
	// more, its stand-in for the namespace itself.
	if n := f.fake.OpenNamespaces(); n != 0 {
		t.Errorf("%d namespaces the server opened are still open, want 0", n)
	}
	for _, pod := range []zds.Pod{a, b, d} {
		if n := netnsFds(t, pod.NetnsID); n != 2 {
			t.Errorf("%d fds open on %s's namespace, want 2 (the Fake's and the peer's)", n, pod.UID)
		}
	}
}

func TestNackIsRetried(t *testing.T) {
	f := newFixture(t, nil)
	p := zdstest.Dial(t, f.path)
	if snap := p.Handshake(); len(snap) != 0 {
		t.Fatalf("snapshot %v, want empty", snap)
	}
	a := f.newPod("pod-a")
	f.srv.PodAdded(a)
	p.Expect(zdstest.Add, a.UID)
	p.Ack("failure to start proxy")
	f.waitState(a.UID, "nacked: failure to start proxy")
	// The retry carries the namespace again.
	f.checkAdd(p.Expect(zdstest.Add, a.UID), a)
	p.Ack("")
	f.waitState(a.UID, "acked")

	// PodAddedWait reports the NACK, and the retry still happens.
	b := f.newPod("pod-b")
	res := make(chan error, 1)
	go func() { res <- f.srv.PodAddedWait(context.Background(), b) }()
	p.Expect(zdstest.Add, b.UID)
	p.Ack("no space left")
	var nack *zds.NackError
	if err := <-res; !errors.As(err, &nack) || nack.Message != "no space left" {
		t.Errorf("PodAddedWait = %v, want the NACK", err)
	}
	p.Expect(zdstest.Add, b.UID)
	p.Ack("")
	f.waitState(b.UID, "acked")
	// And once acked, PodAddedWait says so.
	go func() { res <- f.srv.PodAddedWait(context.Background(), b) }()
	p.Expect(zdstest.Add, b.UID)
	p.Ack("")
	if err := <-res; err != nil {
		t.Errorf("PodAddedWait after an ack = %v", err)
	}
	if st := f.srv.Stats(); st.Nacks != 2 || st.Retries != 2 {
		t.Errorf("stats %+v, want 2 nacks and 2 retries", st)
	}
}

func TestStuckPeerDoesNotBlockOthers(t *testing.T) {
	f := newFixture(t, func(c *zds.Config) { c.AckTimeout = 2 * time.Second })
	old := zdstest.Dial(t, f.path)
	old.Handshake()
	stuck := zdstest.Dial(t, f.path)
	stuck.Handshake()
	f.waitConnected(2)

	a := f.newPod("pod-a")
	f.srv.PodAdded(a)
	stuck.Expect(zdstest.Add, a.UID) // and never acked

	// Neither PodAdded nor PodRemoved waits for the stuck proxy.
	b := f.newPod("pod-b")
	returned := make(chan struct{})
	go func() {
		f.srv.PodAdded(b)
		f.srv.PodRemoved("pod-x")
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(time.Second):
		t.Fatal("PodAdded/PodRemoved blocked on a proxy that does not ack")
	}
	// The other connection is served meanwhile.
	old.Expect(zdstest.Del, "pod-x")
	old.Ack("")
	// A caller asking for the ack gets its own deadline, not a hang.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.srv.PodAddedWait(ctx, b); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("PodAddedWait on the stuck proxy = %v, want the caller's deadline", err)
	}
	if st := f.srv.State(a.UID); st != "pending" {
		t.Errorf("State while unacked = %q, want pending", st)
	}
	// A missed ack costs the connection (later acks could not be matched).
	stuck.ExpectClosed(5 * time.Second)
	f.waitConnected(1)
	if st := f.srv.Stats(); st.AckTimeouts != 1 {
		t.Errorf("stats %+v, want one ack timeout", st)
	}
	// The remaining proxy is the newest now and takes adds.
	f.srv.PodAdded(b)
	old.Expect(zdstest.Add, b.UID)
	old.Ack("")
	f.waitState(b.UID, "acked")
}

func TestReconnectGetsFreshSnapshot(t *testing.T) {
	f := newFixture(t, func(c *zds.Config) { c.KeepaliveInterval = 50 * time.Millisecond })
	a := f.newPod("pod-a")
	p := zdstest.Dial(t, f.path)
	if snap := p.Handshake(); len(snap) != 1 || snap[0].UID != a.UID {
		t.Fatalf("first snapshot %v, want pod-a", snap)
	}
	b := f.newPod("pod-b")
	f.srv.PodAdded(b)
	p.Expect(zdstest.Add, b.UID)
	p.Ack("")
	f.src.del(a.UID)
	f.srv.PodRemoved(a.UID)
	p.Expect(zdstest.Del, a.UID)
	p.Ack("")
	p.Close()
	f.waitConnected(0) // keepalive notices

	c := f.newPod("pod-c")
	p2 := zdstest.Dial(t, f.path)
	snap := p2.Handshake()
	var uids []string
	for _, r := range snap {
		if r.Kind != zdstest.Add {
			t.Errorf("snapshot has %v, want only adds", r)
		}
		uids = append(uids, r.UID)
	}
	if !slices.Equal(uids, []string{b.UID, c.UID}) {
		t.Errorf("second snapshot %v, want [pod-b pod-c]", uids)
	}
}

func TestTwoProxiesAddToNewestDelToAll(t *testing.T) {
	f := newFixture(t, nil)
	old := zdstest.Dial(t, f.path)
	old.Handshake()
	f.waitConnected(1)
	newer := zdstest.Dial(t, f.path)
	newer.Handshake()
	f.waitConnected(2)

	a := f.newPod("pod-a")
	f.srv.PodAdded(a)
	f.checkAdd(newer.Expect(zdstest.Add, a.UID), a)
	newer.Ack("")
	f.waitState(a.UID, "acked")

	f.src.del(a.UID)
	f.srv.PodRemoved(a.UID)
	// Messages arrive in order, so the old proxy's first message being
	// the del proves it was never sent the add.
	old.Expect(zdstest.Del, a.UID)
	old.Ack("")
	newer.Expect(zdstest.Del, a.UID)
	newer.Ack("")
}

func TestKeepaliveAndProtocolErrors(t *testing.T) {
	f := newFixture(t, func(c *zds.Config) {
		c.KeepaliveInterval = 50 * time.Millisecond
		c.HelloTimeout = 200 * time.Millisecond
	})
	// A proxy that goes away while idle is noticed.
	p := zdstest.Dial(t, f.path)
	p.Handshake()
	f.waitConnected(1)
	p.Close()
	f.waitConnected(0)

	// A proxy that speaks unasked is dropped.
	p = zdstest.Dial(t, f.path)
	p.Handshake()
	p.Ack("")
	p.ExpectClosed(2 * time.Second)

	// No hello, a hello of another version, and garbage are all refused.
	silent := zdstest.Dial(t, f.path)
	silent.ExpectClosed(2 * time.Second)
	v0 := zdstest.Dial(t, f.path)
	v0.Send(zdstest.HelloMsg(0))
	v0.ExpectClosed(2 * time.Second)
	junk := zdstest.Dial(t, f.path)
	junk.Send([]byte{0xff, 0xff, 0xff})
	junk.ExpectClosed(2 * time.Second)
	waitFor(t, "protocol errors counted", func() bool { return f.srv.Stats().ProtocolErrors == 3 })
	if st := f.srv.Stats(); st.Connected != 0 {
		t.Errorf("stats %+v, want nobody connected", st)
	}
}

func TestMovedNamespaceIsNeverSent(t *testing.T) {
	f := newFixture(t, nil)
	a := f.newPod("pod-a")
	other := f.newPod("pod-other")
	moved := a
	moved.NetnsPath = other.NetnsPath // the path now leads elsewhere
	f.src.put(moved)

	p := zdstest.Dial(t, f.path)
	p.Hello()
	p.Expect(zdstest.Keep, a.UID)
	p.Ack("")
	f.checkAdd(p.Expect(zdstest.Add, other.UID), other)
	p.Ack("")
	p.Expect(zdstest.SnapshotSent, "")
	p.Ack("")
	f.waitState(a.UID, "netns unavailable")

	f.srv.PodAdded(moved)
	f.waitState(a.UID, "netns unavailable")
	// Nothing was sent for it: the next message is the del.
	f.srv.PodRemoved(a.UID)
	p.Expect(zdstest.Del, a.UID)
	p.Ack("")
	if st := f.srv.Stats(); st.OpenFailures != 2 || st.Retries != 0 {
		t.Errorf("stats %+v, want 2 open failures and no retries", st)
	}
}

// A source that cannot be read must not turn into an empty snapshot,
// which would make the proxy drop every pod.
func TestUnreadableSourceSendsNoSnapshot(t *testing.T) {
	f := newFixture(t, nil)
	f.newPod("pod-a")
	f.src.fail(errors.New("state directory unreadable"))
	p := zdstest.Dial(t, f.path)
	p.Hello()
	p.ExpectClosed(2 * time.Second)

	f.src.fail(nil)
	p = zdstest.Dial(t, f.path)
	if snap := p.Handshake(); len(snap) != 1 {
		t.Errorf("snapshot after recovery %v, want pod-a", snap)
	}
}

func TestNoProxy(t *testing.T) {
	f := newFixture(t, func(c *zds.Config) { c.ProxyWait = 200 * time.Millisecond })
	a := f.newPod("pod-a")
	f.srv.PodAdded(a) // a no-op, not an error
	f.srv.PodRemoved(a.UID)
	start := time.Now()
	if err := f.srv.PodAddedWait(context.Background(), a); !errors.Is(err, zds.ErrNoProxy) {
		t.Errorf("PodAddedWait with no proxy = %v, want ErrNoProxy", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("PodAddedWait gave up after %s; want it to wait ProxyWait for a proxy", d)
	}
}

// TestWaitForAReconnectingProxy: with no proxy connected, PodAddedWait
// waits for one (a proxy reconnecting after a restart) and returns once
// the add of the pod in that proxy's snapshot is acked; the pod is sent
// once, in the snapshot, not again after it.
func TestWaitForAReconnectingProxy(t *testing.T) {
	f := newFixture(t, func(c *zds.Config) { c.ProxyWait = 5 * time.Second })
	a := f.newPod("pod-a")
	res := make(chan error, 1)
	go func() { res <- f.srv.PodAddedWait(context.Background(), a) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-res:
		t.Fatalf("PodAddedWait returned %v before a proxy connected", err)
	default:
	}
	p := zdstest.Dial(t, f.path)
	if snap := p.Handshake(); len(snap) != 1 || snap[0].UID != a.UID {
		t.Fatalf("snapshot %v; want pod-a", snap)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("PodAddedWait = %v; want the snapshot's ack", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("PodAddedWait did not return after the snapshot was acked")
	}
	p.ExpectQuiet(300 * time.Millisecond)
}

// TestNoWaitBeforeServe: before Serve no proxy can connect (the daemon's
// startup pass runs then), so PodAddedWait fails at once.
func TestNoWaitBeforeServe(t *testing.T) {
	src := &source{pods: map[string]zds.Pod{}}
	srv, err := zds.NewServer(zds.Config{Pods: src, Opener: capturetest.NewFake(), ProxyWait: 5 * time.Second,
		SocketGroup: os.Getegid(), Allow: peercred.Allowlist{UIDs: []uint32{uint32(os.Geteuid())}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(filepath.Join(t.TempDir(), "ztunnel.sock")); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	start := time.Now()
	if err := srv.PodAddedWait(context.Background(), zds.Pod{UID: "pod-a"}); !errors.Is(err, zds.ErrNoProxy) {
		t.Errorf("PodAddedWait before Serve = %v, want ErrNoProxy", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("PodAddedWait before Serve waited %s", d)
	}
}

func TestCloseFailsWaiters(t *testing.T) {
	f := newFixture(t, nil)
	p := zdstest.Dial(t, f.path)
	p.Handshake()
	a := f.newPod("pod-a")
	res := make(chan error, 1)
	go func() { res <- f.srv.PodAddedWait(context.Background(), a) }()
	p.Expect(zdstest.Add, a.UID)
	f.srv.Close()
	if err := <-res; !errors.Is(err, zds.ErrClosed) {
		t.Errorf("PodAddedWait across Close = %v, want ErrClosed", err)
	}
	p.ExpectClosed(2 * time.Second)
	if _, err := os.Stat(f.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Close: %v", err)
	}
}

// TestNackedDelIsBounded: a DelWorkload the proxy keeps refusing is not
// retried forever: at most MaxDelAttempts times, and not at all once the
// pod's namespace is gone. Both are logged.
func TestNackedDelIsBounded(t *testing.T) {
	logs := &syncbuf.Buffer{}
	f := newFixture(t, func(c *zds.Config) {
		c.MaxDelAttempts = 3
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "zds", Level: hclog.Debug, Output: logs})
	})
	a := f.newPod("pod-a")
	gone := f.newPod("pod-gone")
	p := zdstest.Dial(t, f.path)
	if snap := p.Handshake(); len(snap) != 2 {
		t.Fatalf("snapshot %v, want both pods", snap)
	}

	f.src.del(a.UID)
	f.srv.PodRemoved(a.UID)
	for range 3 {
		p.Expect(zdstest.Del, a.UID)
		p.Ack("unknown workload")
	}
	p.ExpectQuiet(500 * time.Millisecond)
	if !strings.Contains(logs.String(), "giving up") || !strings.Contains(logs.String(), "refused 3 times") {
		t.Errorf("no log line says the delete was given up:\n%s", logs)
	}

	// The namespace dies with the pod: its bind mount goes, leaving the
	// empty file (or not even that), or a new sandbox's namespace takes
	// the path. Any of them, and one NACK ends it.
	for i, end := range []struct {
		name string
		do   func(path string)
	}{
		{"unmounted", f.fake.AddFile},
		{"deleted", f.fake.DeleteNamespace},
		{"replaced", func(path string) { f.fake.ReplaceNamespace(path) }},
	} {
		f.src.del(gone.UID)
		end.do(gone.NetnsPath)
		f.srv.PodRemoved(gone.UID)
		p.Expect(zdstest.Del, gone.UID)
		p.Ack("unknown workload")
		p.ExpectQuiet(500 * time.Millisecond)
		if n := strings.Count(logs.String(), "the pod's namespace is gone"); n != i+1 {
			t.Errorf("%s: %d log lines say the namespace is gone, want %d:\n%s", end.name, n, i+1, logs)
		}
		// The next round's pod, under the same uid.
		gone = f.newPod(gone.UID)
		f.srv.PodAdded(gone)
		p.Expect(zdstest.Add, gone.UID)
		p.Ack("")
		f.waitState(gone.UID, "acked")
	}
	// The connection still works.
	b := f.newPod("pod-b")
	f.srv.PodAdded(b)
	p.Expect(zdstest.Add, b.UID)
	p.Ack("")
	f.waitState(b.UID, "acked")
}

// TestRecreatedNamespaceIsNeverSent: a sandbox recreated under the same
// path gets another namespace, sometimes with the freed one's inode (the
// kernel reuses inode numbers; only the cookie differs). Neither is sent
// for the enrolled pod, nor retried, until the pod is enrolled again.
func TestRecreatedNamespaceIsNeverSent(t *testing.T) {
	f := newFixture(t, nil)
	a, b := f.newPod("pod-a"), f.newPod("pod-b")
	f.fake.ReplaceNamespace(a.NetnsPath)
	f.fake.ReplaceReusingInode(b.NetnsPath)

	p := zdstest.Dial(t, f.path)
	p.Hello()
	p.Expect(zdstest.Keep, a.UID)
	p.Ack("")
	p.Expect(zdstest.Keep, b.UID)
	p.Ack("")
	p.Expect(zdstest.SnapshotSent, "")
	p.Ack("")
	f.waitState(a.UID, "netns unavailable")
	f.waitState(b.UID, "netns unavailable")

	f.srv.PodAdded(a)
	f.srv.PodAdded(b)
	waitFor(t, "both adds to fail", func() bool { return f.srv.Stats().OpenFailures == 4 })
	p.ExpectQuiet(200 * time.Millisecond)
	if st := f.srv.Stats(); st.OpenFailures != 4 || st.Retries != 0 {
		t.Errorf("stats %+v, want 4 open failures and no retries", st)
	}
	for _, pod := range []zds.Pod{a, b} {
		if st := f.srv.State(pod.UID); !strings.Contains(st, "another namespace") {
			t.Errorf("State(%s) = %q, want it to say the path leads to another namespace", pod.UID, st)
		}
	}

	// Enrolled again with the namespace now there, each is sent.
	for _, pod := range []zds.Pod{a, b} {
		pod.NetnsID = f.netnsID(pod.NetnsPath)
		f.src.put(pod)
		f.srv.PodAdded(pod)
		f.checkAdd(p.Expect(zdstest.Add, pod.UID), pod)
		p.Ack("")
		f.waitState(pod.UID, "acked")
	}
}

// TestOpenFailures: a namespace that is gone, is not one, is the node's
// own or may not be opened is given up on at once; one that did not
// answer in time is retried with backoff until it can be sent.
func TestOpenFailures(t *testing.T) {
	f := newFixture(t, nil)
	p := zdstest.Dial(t, f.path)
	p.Handshake()

	for _, tc := range []struct {
		name string
		do   func(path string)
		want error
	}{
		{"deleted", f.fake.DeleteNamespace, netns.ErrNotExist},
		{"not a namespace", f.fake.AddFile, netns.ErrNotNetns},
		{"the node's", f.fake.AddHost, netns.ErrHostNetns},
		{"no access", func(path string) { f.fake.SetOpenError(path, fmt.Errorf("open %s: %w", path, netns.ErrNoAccess)) }, netns.ErrNoAccess},
	} {
		pod := f.newPod("pod-" + strings.ReplaceAll(tc.name, " ", "-"))
		tc.do(pod.NetnsPath)
		before := f.srv.Stats()
		if err := f.srv.PodAddedWait(context.Background(), pod); !errors.Is(err, tc.want) {
			t.Errorf("%s: PodAddedWait = %v, want %v", tc.name, err, tc.want)
		}
		// Several backoffs: a retry would show as another failure.
		time.Sleep(200 * time.Millisecond)
		if st := f.srv.Stats(); st.OpenFailures != before.OpenFailures+1 || st.Retries != before.Retries {
			t.Errorf("%s: stats %+v after %+v, want one more open failure and no retry", tc.name, st, before)
		}
		if st := f.srv.State(pod.UID); !strings.HasPrefix(st, "netns unavailable") {
			t.Errorf("%s: State = %q, want netns unavailable", tc.name, st)
		}
	}
	p.ExpectQuiet(100 * time.Millisecond)

	// A namespace that times out at the snapshot is kept, then sent once
	// it answers; one that times out later is sent the same way.
	late := f.newPod("pod-late")
	slow := f.newPod("pod-slow")
	timeout := func(path string) error { return fmt.Errorf("open %s: %w", path, netns.ErrTimeout) }
	f.fake.SetOpenError(slow.NetnsPath, timeout(slow.NetnsPath))
	f.src.del(late.UID)
	for _, uid := range []string{"pod-deleted", "pod-not-a-namespace", "pod-the-node's", "pod-no-access"} {
		f.src.del(uid)
	}
	p2 := zdstest.Dial(t, f.path)
	p2.Hello()
	p2.Expect(zdstest.Keep, slow.UID)
	p2.Ack("")
	p2.Expect(zdstest.SnapshotSent, "")
	p2.Ack("")
	f.waitConnected(2)
	f.src.put(late)
	f.fake.SetOpenError(late.NetnsPath, timeout(late.NetnsPath))
	if err := f.srv.PodAddedWait(context.Background(), late); !errors.Is(err, netns.ErrTimeout) {
		t.Errorf("PodAddedWait = %v, want the timeout", err)
	}
	waitFor(t, "retries of both pods", func() bool { return f.srv.Stats().Retries >= 4 })
	for _, pod := range []zds.Pod{slow, late} {
		if st := f.srv.State(pod.UID); !strings.HasPrefix(st, "netns unavailable") {
			t.Errorf("State(%s) = %q while it times out, want netns unavailable", pod.UID, st)
		}
		f.fake.SetOpenError(pod.NetnsPath, nil)
		f.checkAdd(p2.Expect(zdstest.Add, pod.UID), pod)
		p2.Ack("")
		f.waitState(pod.UID, "acked")
	}
	if n := f.fake.OpenNamespaces(); n != 0 {
		t.Errorf("%d namespaces left open, want 0", n)
	}
}

// TestUnlistedCallerIsRefused is TestCallerNotAllowedGetsNothing for a
// tester without root, whose own uid is then a caller the allowlist
// refuses; root is always allowed, so as root only that test can check.
func TestUnlistedCallerIsRefused(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root is always allowed: TestCallerNotAllowedGetsNothing refuses a child of another uid")
	}
	for _, tc := range []struct {
		name  string
		allow peercred.Allowlist
		ok    bool
	}{
		{"root only", peercred.Allowlist{}, false},
		{"another uid", peercred.Allowlist{UIDs: []uint32{uint32(os.Geteuid()) + 1}}, false},
		{"the tester's gid", peercred.Allowlist{GIDs: []uint32{uint32(os.Getegid())}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(c *zds.Config) { c.Allow = tc.allow })
			a := f.newPod("pod-a")
			p := zdstest.Dial(t, f.path)
			if !tc.ok {
				p.ExpectClosed(2 * time.Second)
				if st := f.srv.Stats(); st.Refused != 1 || st.Accepted != 0 {
					t.Errorf("stats %+v, want 1 refused and none accepted", st)
				}
				return
			}
			if snap := p.Handshake(); len(snap) != 1 {
				t.Fatalf("snapshot %v, want pod-a", snap)
			}
			f.waitState(a.UID, "acked")
		})
	}
}

// ackLog records the Acked hook's calls.
type ackLog struct {
	mu   sync.Mutex
	uids []string
}

func (l *ackLog) add(uid string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.uids = append(l.uids, uid)
}

func (l *ackLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.uids)
}

// TestAckedHook: the hook hears of every add a proxy acked, the
// snapshot's included, and of nothing else: not a NACK, not a keep of a
// namespace that cannot be opened, not a delete. The Kubernetes agent
// annotates a pod only once the hook has fired for it.
func TestAckedHook(t *testing.T) {
	var log ackLog
	f := newFixture(t, func(c *zds.Config) { c.Acked = log.add })
	a := f.newPod("pod-a")
	f.src.put(zds.Pod{UID: "pod-gone", NetnsPath: "/run/netns/nftr-never-existed"})
	p := zdstest.Dial(t, f.path)
	p.Hello()
	p.Expect(zdstest.Add, a.UID)
	p.Ack("")
	p.Expect(zdstest.Keep, "pod-gone")
	p.Ack("")
	p.Expect(zdstest.SnapshotSent, "")
	p.Ack("")
	f.waitState(a.UID, zds.StateAcked)
	waitFor(t, "the snapshot ack's hook", func() bool { return len(log.get()) == 1 })

	b := f.newPod("pod-b")
	f.srv.PodAdded(b)
	p.Expect(zdstest.Add, b.UID)
	p.Ack("not yet")
	f.waitState(b.UID, "nacked")
	if got := log.get(); !slices.Equal(got, []string{a.UID}) {
		t.Fatalf("after a NACK the hook heard %v; want only %s", got, a.UID)
	}
	// The retry is acked.
	p.Expect(zdstest.Add, b.UID)
	p.Ack("")
	f.waitState(b.UID, zds.StateAcked)
	waitFor(t, "the retry's hook", func() bool { return len(log.get()) == 2 })

	f.src.del(a.UID)
	f.srv.PodRemoved(a.UID)
	p.Expect(zdstest.Del, a.UID)
	p.Ack("")
	p.ExpectQuiet(200 * time.Millisecond)
	if got := log.get(); !slices.Equal(got, []string{a.UID, b.UID}) {
		t.Errorf("hook heard %v; want %s then %s, nothing for the keep or the delete", got, a.UID, b.UID)
	}
}
