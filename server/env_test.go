package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/syncbuf"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/state"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// These helpers build real namespaces and a real server on a Unix socket.
// The test process never changes namespace and never touches the node's
// ruleset; everything is removed in t.Cleanup.

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

// testNetns is a named namespace under /run/netns.
type testNetns struct {
	name string
	path string
}

func newNetns(t *testing.T) *testNetns {
	t.Helper()
	nstest.RequirePrivileged(t)
	n := &testNetns{name: fmt.Sprintf("nftr-s-%08x", rand.Uint32())}
	n.path = "/run/netns/" + n.name
	n.create(t)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.name).Run() })
	return n
}

func (n *testNetns) create(t *testing.T) {
	t.Helper()
	run(t, "ip", "netns", "add", n.name)
	run(t, "ip", "-n", n.name, "link", "set", "lo", "up")
}

func (n *testNetns) del(t *testing.T) {
	t.Helper()
	run(t, "ip", "netns", "del", n.name)
}

// hasTable reports whether our table exists in the namespace.
func (n *testNetns) hasTable(t *testing.T) bool {
	t.Helper()
	return strings.Contains(run(t, "ip", "netns", "exec", n.name, "nft", "list", "tables"), "inet "+nft.TableName)
}

func (n *testNetns) listTable(t *testing.T) string {
	t.Helper()
	return run(t, "ip", "netns", "exec", n.name, "nft", "list", "table", "inet", nft.TableName)
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
	guard  *netns.Guard
	conn   *grpc.ClientConn
	api    nftredirv1.RedirectServiceClient
	health healthgrpc.HealthClient
	logs   *syncbuf.Buffer
	stop   func()
}

// testConfig is everything a test server is made of: the server's
// Config, the lifecycle engine's, and the kernel engine's parts.
type testConfig struct {
	Config
	Pods     lifecycle.Config
	Guard    *netns.Guard
	Applier  nft.Applier
	StateDir string
}

// serverOpt adjusts the testConfig before the server starts.
type serverOpt func(*testConfig)

func withApplier(a nft.Applier) serverOpt { return func(c *testConfig) { c.Applier = a } }
func withStateDir(d string) serverOpt     { return func(c *testConfig) { c.StateDir = d } }

// startServer runs a server and waits for it to serve unless wait is false.
func startServer(t *testing.T, wait bool, opts ...serverOpt) *testServer {
	t.Helper()
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	guard, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	cfg := testConfig{
		Config:   Config{Logger: log, ReconcileInterval: -1, Reflection: true},
		Pods:     lifecycle.Config{Logger: log},
		Guard:    guard,
		Applier:  nft.NewNetlink(),
		StateDir: filepath.Join(dir, "pods"),
	}
	for _, o := range opts {
		o(&cfg)
	}
	store, err := state.Open(cfg.StateDir, log)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pods.Store = store
	cfg.Pods.Engine = capture.NewKernel(cfg.Guard, cfg.Applier)
	pods, err := lifecycle.New(cfg.Pods)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Config.Pods = pods
	srv, err := New(cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{srv: srv, pods: pods, guard: cfg.Guard, dir: dir, socket: filepath.Join(dir, "nftredir.sock"), logs: logs}
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

func (ts *testServer) waitServing(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := ts.health.Watch(ctx, &healthgrpc.HealthCheckRequest{Service: ServiceName})
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

// hookApplier wraps the kernel applier so a test can block or break it.
type hookApplier struct {
	nft.Applier
	beforeApply  func(rs *nft.Ruleset)
	beforeVerify func()
}

func (h *hookApplier) Apply(ctx context.Context, ns *netns.Handle, rs *nft.Ruleset) error {
	if h.beforeApply != nil {
		h.beforeApply(rs)
	}
	return h.Applier.Apply(ctx, ns, rs)
}

func (h *hookApplier) Verify(ctx context.Context, ns *netns.Handle, rs *nft.Ruleset) (nft.Status, string, error) {
	if h.beforeVerify != nil {
		h.beforeVerify()
	}
	return h.Applier.Verify(ctx, ns, rs)
}

var errInjected = errors.New("injected apply failure")

// failingApplier fails Apply for one pod, after nothing was changed, the
// way the kernel rejecting a batch does.
type failingApplier struct {
	nft.Applier
	pod string
}

func (f *failingApplier) Apply(ctx context.Context, ns *netns.Handle, rs *nft.Ruleset) error {
	if rs.Spec.PodID == f.pod {
		return errInjected
	}
	return f.Applier.Apply(ctx, ns, rs)
}
