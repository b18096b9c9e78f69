package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/testkit/syncbuf"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/state"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// These helpers build a real server on a Unix socket, over the Fake
// capture engine by default, or over the kernel engine and real
// namespaces for tests about the kernel. The test process never changes
// namespace and never touches the node's ruleset; everything is removed
// in t.Cleanup.

const dialEnv = "NFTREDIR_SERVER_TEST_DIAL"

func TestMain(m *testing.M) {
	// Re-executed as another uid by TestPeerCredentialDenial: act as a
	// client, print the status code, exit.
	if sock := os.Getenv(dialEnv); sock != "" {
		os.Exit(dialHelper(sock))
	}
	os.Exit(m.Run())
}

func dialHelper(sock string) int {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = nftredirv1.NewRedirectServiceClient(conn).ListPods(ctx, &nftredirv1.ListPodsRequest{})
	st := status.Convert(err)
	fmt.Printf("%s|%s\n", st.Code(), st.Message())
	return 0
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// world is where a test server's pod namespaces live: the in-memory
// capturetest.Fake (fake set), or real namespaces programmed by the
// kernel engine. Namespaces come from the Env; what they hold is read by
// look, from the Fake's state or with the ip and nft binaries.
type world struct {
	capturetest.Env
	fake *capturetest.Fake // nil on the kernel
}

func fakeWorld(t *testing.T) *world {
	f := capturetest.NewFake()
	return &world{Env: capturetest.NewFakeEnvOf(t, f), fake: f}
}

// kernelWorld needs root: the test is skipped when
// NFTREDIR_SKIP_PRIVILEGED=1.
func kernelWorld(t *testing.T) *world { return &world{Env: capturetest.NewKernelEnv(t)} }

// engines are the worlds a test that must hold on both runs in. The
// kernel run is what keeps the Fake honest at the level of the API.
var engines = []struct {
	name  string
	world func(*testing.T) *world
}{{"fake", fakeWorld}, {"kernel", kernelWorld}}

// onEngines runs test once per engine, as subtests.
func onEngines(t *testing.T, test func(t *testing.T, w *world)) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) { test(t, e.world(t)) })
	}
}

// nsState is what a namespace holds of ours: the listing of our table
// ("" when there is none), and how many of our fwmark rules and local
// routes exist, over both families (a pod has two of each).
type nsState struct {
	table         string
	rules, routes int
}

func (s nsState) captured() bool  { return s.table != "" && s.rules == 2 && s.routes == 2 }
func (s nsState) untouched() bool { return s.table == "" && s.rules == 0 && s.routes == 0 }

// look reads the namespace at path for the daemon's default routing.
func (w *world) look(t *testing.T, path string) nsState {
	t.Helper()
	r := netns.DefaultRouting()
	if w.fake != nil {
		var st nsState
		if rs, tampered := w.fake.Table(path); rs != nil {
			st.table = rs.String()
			if tampered {
				st.table += "# tampered\n"
			}
		}
		rt := w.fake.Routing(path, r)
		for _, ok := range []bool{rt.V4Rule, rt.V6Rule} {
			if ok {
				st.rules++
			}
		}
		for _, ok := range []bool{rt.V4Route, rt.V6Route} {
			if ok {
				st.routes++
			}
		}
		return st
	}
	name := filepath.Base(path)
	var st nsState
	if strings.Contains(run(t, "ip", "netns", "exec", name, "nft", "list", "tables"), "inet "+nft.TableName) {
		st.table = run(t, "ip", "netns", "exec", name, "nft", "list", "table", "inet", nft.TableName)
	}
	rule := fmt.Sprintf("fwmark %#x/%#x lookup %d", r.Mark, r.Mask, r.Table)
	for _, fam := range []string{"-4", "-6"} {
		for l := range strings.Lines(run(t, "ip", "-n", name, fam, "rule", "show")) {
			if strings.Contains(l, rule) {
				st.rules++
			}
		}
		// Not "show table 100", which fails once the table is empty.
		for l := range strings.Lines(run(t, "ip", "-n", name, fam, "route", "show", "table", "all")) {
			f := strings.Fields(l)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "table" && f[i+1] == strconv.Itoa(r.Table) {
					st.routes++
				}
			}
		}
	}
	return st
}

// id opens the namespace at path through the world's engine for its
// identity.
func (w *world) id(t *testing.T, path string) netns.ID {
	t.Helper()
	h, err := w.Engine().Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return h.ID()
}

// hostHasTable checks the test process's own namespace, which nftredird
// must never program.
func hostHasTable(t *testing.T) bool {
	t.Helper()
	return strings.Contains(run(t, "nft", "list", "tables"), "inet "+nft.TableName)
}

// testServer is a Server running on a socket in a temp dir, and a client.
type testServer struct {
	srv    *Server
	socket string
	dir    string
	pods   *lifecycle.Manager
	w      *world
	conn   *grpc.ClientConn
	api    nftredirv1.RedirectServiceClient
	health healthgrpc.HealthClient
	logs   *syncbuf.Buffer
	stop   func()
}

// testConfig is everything a test server is made of: the server's
// Config, the lifecycle engine's, and the world its engine works on.
type testConfig struct {
	Config
	Pods lifecycle.Config
	// World is the Fake's unless a test asks for another.
	World *world
	// Wrap, when set, wraps the world's engine, for a test that must
	// hold or break a call midway.
	Wrap     func(capture.Engine) capture.Engine
	StateDir string
}

// serverOpt adjusts the testConfig before the server starts.
type serverOpt func(*testConfig)

func withWorld(w *world) serverOpt    { return func(c *testConfig) { c.World = w } }
func withStateDir(d string) serverOpt { return func(c *testConfig) { c.StateDir = d } }
func withHooks(h *hookEngine) serverOpt {
	return func(c *testConfig) {
		c.Wrap = func(e capture.Engine) capture.Engine { h.Engine = e; return h }
	}
}

// startServer runs a server and waits for it to serve unless wait is
// false. Its engine is the Fake unless withWorld says otherwise.
func startServer(t *testing.T, wait bool, opts ...serverOpt) *testServer {
	t.Helper()
	dir := t.TempDir()
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	cfg := testConfig{
		Config:   Config{Logger: log, ReconcileInterval: -1, Reflection: true},
		Pods:     lifecycle.Config{Logger: log},
		StateDir: filepath.Join(dir, "pods"),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if uid := os.Geteuid(); uid != 0 {
		// Root may always call; a test run as another user on the Fake
		// must be allowed to call its own server.
		cfg.AllowUIDs = append(cfg.AllowUIDs, uint32(uid))
	}
	if cfg.World == nil {
		cfg.World = fakeWorld(t)
	}
	if f := cfg.World.fake; f != nil {
		// Registered before the server's stop, so it runs after it: by
		// then every call has closed what it opened.
		t.Cleanup(func() {
			if n := f.OpenNamespaces(); n != 0 {
				t.Errorf("%d namespaces left open after the server stopped", n)
			}
		})
	}
	store, err := state.Open(cfg.StateDir, log)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pods.Store = store
	cfg.Pods.Engine = cfg.World.Engine()
	if cfg.Wrap != nil {
		cfg.Pods.Engine = cfg.Wrap(cfg.Pods.Engine)
	}
	pods, err := lifecycle.New(cfg.Pods)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Config.Pods = pods
	srv, err := New(cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{srv: srv, pods: pods, w: cfg.World, dir: dir, socket: filepath.Join(dir, "nftredir.sock"), logs: logs}
	lis, err := net.Listen("unix", ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis, 2*time.Second) }()
	var once sync.Once
	ts.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server Run: %v", err)
			}
		})
	}
	t.Cleanup(ts.stop)
	ts.conn, err = grpc.NewClient("unix://"+ts.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ts.conn.Close() })
	ts.api = nftredirv1.NewRedirectServiceClient(ts.conn)
	ts.health = healthgrpc.NewHealthClient(ts.conn)
	if wait {
		ts.waitServing(t)
	}
	if t.Failed() {
		t.Logf("server log:\n%s", logs.String())
	}
	return ts
}

// newNS makes an empty pod namespace in the server's world.
func (ts *testServer) newNS(t *testing.T) string { t.Helper(); return ts.w.NewNamespace(t) }

// look reads what the namespace at path holds of ours.
func (ts *testServer) look(t *testing.T, path string) nsState { t.Helper(); return ts.w.look(t, path) }

func (ts *testServer) waitServing(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := ts.health.Watch(ctx, &healthgrpc.HealthCheckRequest{Service: nftredirv1.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			t.Fatalf("waiting for SERVING: %v", err)
		}
		if resp.Status == healthgrpc.HealthCheckResponse_SERVING {
			return
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (ts *testServer) add(t *testing.T, uid, path string) (*nftredirv1.AddPodResponse, error) {
	t.Helper()
	return ts.api.AddPod(ctxT(t), &nftredirv1.AddPodRequest{PodUid: uid, PodName: uid, PodNamespace: "default", NetnsPath: path, PodIps: []string{"10.244.0.9"}})
}

func (ts *testServer) mustAdd(t *testing.T, uid, path string) *nftredirv1.Pod {
	t.Helper()
	resp, err := ts.add(t, uid, path)
	if err != nil {
		t.Fatalf("AddPod %s: %v\nserver log:\n%s", uid, err, ts.logs.String())
	}
	return resp.Pod
}

func (ts *testServer) get(t *testing.T, uid string) *nftredirv1.GetPodResponse {
	t.Helper()
	resp, err := ts.api.GetPod(ctxT(t), &nftredirv1.GetPodRequest{PodUid: uid})
	if err != nil {
		t.Fatalf("GetPod %s: %v", uid, err)
	}
	return resp
}

func (ts *testServer) records(t *testing.T) []*state.Record {
	t.Helper()
	recs, err := ts.pods.Store().List()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// hookEngine runs a test's hooks inside the engine's calls, before the
// wrapped engine does anything, so a test can hold a call midway (under
// the pod's lock) or make it panic. It wraps either engine.
type hookEngine struct {
	capture.Engine
	beforeApply   func(rs *nft.Ruleset)
	beforeInspect func()
}

// Open wraps the namespace so that its calls run the hooks.
func (h *hookEngine) Open(path string) (capture.Namespace, error) {
	ns, err := h.Engine.Open(path)
	if err != nil {
		return nil, err
	}
	return &hookNamespace{Namespace: ns, hooks: h}, nil
}

type hookNamespace struct {
	capture.Namespace
	hooks *hookEngine
}

func (n *hookNamespace) Apply(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (capture.Change, error) {
	if n.hooks.beforeApply != nil {
		n.hooks.beforeApply(rs)
	}
	return n.Namespace.Apply(ctx, rs, r)
}

func (n *hookNamespace) Inspect(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (capture.Live, error) {
	if n.hooks.beforeInspect != nil {
		n.hooks.beforeInspect()
	}
	return n.Namespace.Inspect(ctx, rs, r)
}

// releaseAtCleanup returns the func that closes release, a hook's hold
// on a call, and runs it at cleanup too: before the server stops, which
// would otherwise wait for the held call forever once the test failed.
// Call it after startServer.
func releaseAtCleanup(t *testing.T, release chan struct{}) func() {
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let)
	return let
}

// errInjected is the failure a test makes the Fake's engine return.
var errInjected = errors.New("injected apply failure")
