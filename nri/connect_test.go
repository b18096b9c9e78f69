package nri_test

import (
	"context"
	"io"
	"net"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"

	"github.com/nftredir/nftredir/nri"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// halfRuntime is a runtime's NRI socket whose first connections end
// between the plugin's registration and its configuration: the runtime's
// side accepts RegisterPlugin and then never calls Configure, keeping the
// connection open (a runtime wedged there) or closing it (a runtime that
// exits, or drops the connection, in between). Later connections go to a
// real runtime, to show that the plugin's next attempt is not held up.
type halfRuntime struct {
	t    *testing.T
	path string
	// drop: close the connection once the registration is answered.
	drop bool

	mu sync.Mutex
	// protects the following fields
	half       int // connections still to be answered halfway
	backend    string
	registered int
	conns      []net.Conn
}

func startHalfRuntime(t *testing.T, half int, drop bool, backend string) *halfRuntime {
	t.Helper()
	h := &halfRuntime{t: t, path: filepath.Join(t.TempDir(), "nri.sock"), drop: drop, half: half, backend: backend}
	l, err := net.Listen("unix", h.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			halfway := h.half > 0
			if halfway {
				h.half--
			}
			backend := h.backend
			h.mu.Unlock()
			if halfway {
				go h.registerOnly(c)
				continue
			}
			b, err := net.Dial("unix", backend)
			if err != nil {
				c.Close()
				continue
			}
			h.mu.Lock()
			h.conns = append(h.conns, b)
			h.mu.Unlock()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	return h
}

// registerOnly is the runtime's side of an NRI connection up to the
// plugin's registration, as the NRI project's runtime library lays it
// out (the connection multiplexed, the runtime's service on its own
// channel), and no further.
func (h *halfRuntime) registerOnly(c net.Conn) {
	mux := multiplex.Multiplex(c, multiplex.WithBlockedRead())
	l, err := mux.Listen(multiplex.RuntimeServiceConn)
	if err != nil {
		c.Close()
		return
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		c.Close()
		return
	}
	answered := make(chan struct{})
	api.RegisterRuntimeService(srv, registrar{func() {
		h.mu.Lock()
		h.registered++
		h.mu.Unlock()
		close(answered)
	}})
	go func() { _ = srv.Serve(context.Background(), l) }()
	mux.Unblock()
	<-answered
	if h.drop {
		// Once the answer has left: the plugin's registration succeeds,
		// and then its connection is gone.
		time.Sleep(50 * time.Millisecond)
		srv.Close()
		mux.Close()
	}
}

func (h *halfRuntime) registrations() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.registered
}

// registrar answers a plugin's registration and nothing else.
type registrar struct{ registered func() }

func (r registrar) RegisterPlugin(context.Context, *api.RegisterPluginRequest) (*api.Empty, error) {
	defer r.registered()
	return &api.Empty{}, nil
}

func (registrar) UpdateContainers(context.Context, *api.UpdateContainersRequest) (*api.UpdateContainersResponse, error) {
	return &api.UpdateContainersResponse{}, nil
}

// runPlugin runs the plugin until the test ends; the cleanup requires
// its Run to return, and no connection attempt of the NRI library's stub
// to be left behind, soon after its context ends.
func runPlugin(t *testing.T, d *daemon, cfg nri.Config) (first <-chan error) {
	t.Helper()
	cfg.Pods = d.pods
	if cfg.Logger == nil {
		cfg.Logger = testLog(t, "nri")
	}
	p, err := nri.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.plugin = p
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx, out)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("the plugin's Run did not return within 5s of its context's end: a connection attempt is stuck")
			return
		}
		if n := stuckStubs(2 * time.Second); n > 0 {
			t.Errorf("%d goroutines of the NRI stub still wait in Start after the plugin stopped", n)
		}
	})
	return out
}

// stuckStubs counts, after waiting up to wait for them to go, the
// goroutines inside the NRI stub's Start: its wait for Configure.
func stuckStubs(wait time.Duration) int {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<22)
		buf = buf[:goruntime.Stack(buf, true)]
		n := strings.Count(string(buf), "nri/pkg/stub.(*stub).Start(")
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A runtime that takes the plugin's registration and never configures it
// would hold the NRI library's stub for ever (it waits for Configure with
// neither a timeout nor its context): the plugin gives the attempt a
// bounded time, closes it, says why, and connects again.
func TestRuntimeThatNeverConfigures(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	half := startHalfRuntime(t, 1, false, rt.socket)
	start := time.Now()
	first := runPlugin(t, d, nri.Config{Socket: half.path, ConfigureTimeout: 300 * time.Millisecond})
	select {
	case err := <-first:
		if err == nil || !strings.Contains(err.Error(), "did not configure") {
			t.Fatalf("first connection: %v; want it given up, the runtime not having configured the plugin", err)
		}
		t.Logf("first connection given up after %s: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first connection neither registered nor failed in 10s")
	}
	if n := half.registrations(); n != 1 {
		t.Fatalf("%d registrations on the half runtime; want 1", n)
	}
	d.waitState(t, "registered with the next runtime", func(s nri.State) bool { return s.Registered })
	web := sandbox("mesh", "web", "10.1.0.5")
	if err := rt.runPodSandbox(web); err != nil {
		t.Fatal(err)
	}
	if got := d.enrolled(t, web); got != nri.NetnsPath(web) {
		t.Errorf("mesh/web enrolled through %q after the second connection's RunPodSandbox", got)
	}
}

// A connection that drops between the registration and Configure is
// followed by the next one at once, not after the bound on Configure.
func TestConnectionDropsBeforeConfigure(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil))
	web := sandbox("mesh", "web", "10.1.0.5")
	rt := startRuntime(t, "containerd", "v2.4.2", "", web)
	half := startHalfRuntime(t, 2, true, rt.socket)
	start := time.Now()
	runPlugin(t, d, nri.Config{Socket: half.path, ConfigureTimeout: time.Minute})
	d.waitState(t, "registered with the runtime after two dropped connections", func(s nri.State) bool { return s.Registered })
	took := time.Since(start)
	t.Logf("registered %s after the first attempt, two connections having dropped before Configure", took.Round(time.Millisecond))
	if n := half.registrations(); n != 2 {
		t.Errorf("%d registrations answered halfway; want 2", n)
	}
	if took > 10*time.Second {
		t.Errorf("registered only %s after the start; a dropped connection must not wait out the bound on Configure", took.Round(time.Millisecond))
	}
	if got := d.enrolled(t, web); got != nri.NetnsPath(web) {
		t.Errorf("mesh/web enrolled through %q after Synchronize", got)
	}
}

// heldPods holds AddPod of one pod, after it has done its work, until
// released: the runtime can go away while Synchronize is still busy.
type heldPods struct {
	nri.Pods
	uid      string
	reached  chan struct{}
	release  chan struct{}
	holdOnce sync.Once
}

func (h *heldPods) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	resp, err := h.Pods.AddPod(ctx, req)
	if req.GetPodUid() == h.uid {
		h.holdOnce.Do(func() {
			close(h.reached)
			<-h.release
		})
	}
	return resp, err
}

// The runtime exits while the plugin's Synchronize is enrolling pods; the
// Synchronize then finishes, its answer undelivered. The plugin must not
// count itself registered on the strength of it: the next runtime has
// not accepted it, and its validator holds pods back until it has. Once
// a runtime is back, the plugin registers with it.
func TestRuntimeExitsDuringSynchronize(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil), apiPod("mesh", "late", nil))
	web := sandbox("mesh", "web", "10.1.0.5")
	rt := startRuntime(t, "containerd", "v2.4.2", "", web)
	proxy := newProxy(t, rt.socket)
	held := &heldPods{Pods: d.pods, uid: web.Uid, reached: make(chan struct{}), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(held.release)
		}
	}
	t.Cleanup(release)
	p, err := nri.New(nri.Config{Pods: held, Socket: proxy.path, Logger: testLog(t, "nri")})
	if err != nil {
		t.Fatal(err)
	}
	d.plugin = p
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx, nil) }()
	t.Cleanup(func() { release(); cancel(); <-done })

	select {
	case <-held.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("Synchronize did not reach mesh/web in 10s")
	}
	// The runtime exits; none is there for a while.
	rt.r.Stop()
	proxy.drop(filepath.Join(t.TempDir(), "gone.sock"))
	d.waitState(t, "disconnected", func(s nri.State) bool { return !s.Registered && s.Err != "" })
	release()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if s := p.State(); s.Registered {
			t.Fatalf("registered with no runtime there, on a Synchronize whose connection had ended: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}

	late := sandbox("mesh", "late", "10.1.0.8")
	rt2 := startRuntime(t, "containerd", "v2.4.2", "", web, late)
	proxy.drop(rt2.socket)
	d.waitState(t, "registered with the runtime that came back", func(s nri.State) bool { return s.Registered })
	for _, sb := range []*api.PodSandbox{web, late} {
		if got := d.enrolled(t, sb); got != nri.NetnsPath(sb) {
			t.Errorf("%s/%s enrolled through %q", sb.Namespace, sb.Name, got)
		}
		if err := rt2.createContainer(sb, "app"); err != nil {
			t.Errorf("creating a container of %s/%s: %v", sb.Namespace, sb.Name, err)
		}
	}
}
