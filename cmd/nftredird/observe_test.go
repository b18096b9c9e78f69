package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/nri"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/server"
	"github.com/nftredir/nftredir/state"
)

// gatedApplier holds every Verify until open is closed: a startup
// reconcile that takes as long as the test wants.
type gatedApplier struct {
	nft.Applier
	open chan struct{}
}

func (g *gatedApplier) Verify(ctx context.Context, h *netns.Handle, rs *nft.Ruleset) (nft.Status, string, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	return g.Applier.Verify(ctx, h, rs)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// runServer serves srv on socket until the returned stop is called.
func runServer(t *testing.T, srv *server.Server, socket string) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis, 5*time.Second) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestReadyzWaitsForStartupReconcile restarts a server on the state of an
// enrolled pod with a startup reconcile held open: /healthz answers 200
// (a slow start must not get the daemon killed) and /readyz 503 until the
// reconcile is done, then 200.
func TestReadyzWaitsForStartupReconcile(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "pods")
	socket := filepath.Join(dir, "nftredir.sock")
	guard, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	ns := nstest.NewNetns(t)
	build := func(cfg server.Config, applier nft.Applier, pcfg lifecycle.Config) (*server.Server, *lifecycle.Manager) {
		t.Helper()
		store, err := state.Open(stateDir, nil)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.Store, pcfg.Engine = store, capture.NewKernel(guard, applier)
		pods, err := lifecycle.New(pcfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Pods, cfg.ReconcileInterval = pods, -1
		srv, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return srv, pods
	}

	// A first server enrols the pod, so the second has a record to
	// reconcile at its start.
	srv, _ := build(server.Config{}, nft.NewNetlink(), lifecycle.Config{})
	stop := runServer(t, srv, socket)
	c, err := client.Dial(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.AddPod(context.Background(), &nftredirv1.AddPodRequest{PodUid: "readyz-pod", NetnsPath: ns.Path}); err != nil {
		t.Fatal(err)
	}
	stop()

	gate := &gatedApplier{Applier: nft.NewNetlink(), open: make(chan struct{})}
	opened := false
	defer func() {
		if !opened {
			close(gate.open)
		}
	}()
	var second server.Config
	var secondPods lifecycle.Config
	applier := nft.Applier(gate)
	opts := &options{socket: socket, metricsAddress: "127.0.0.1:0"}
	log := hclog.NewNullLogger()
	met := observe(opts, &second, &secondPods, &applier, log)
	srv, pods := build(second, applier, secondPods)
	setSources(met, pods, nil, nil, nil, nil)
	runServer(t, srv, socket)
	addr, stopHTTP, err := serveHTTP(opts, readiness(opts, srv, nil, nil), met, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stopHTTP()
	url := "http://" + addr

	if code, body := get(t, url+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz during the startup reconcile: %d %q; want 200", code, body)
	}
	if code, body := get(t, url+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "FAIL startup reconcile") {
		t.Errorf("/readyz during the startup reconcile: %d %q; want 503", code, body)
	}
	close(gate.open)
	opened = true
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := get(t, url+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after the startup reconcile: %d %q; want 200", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, body := get(t, url+"/metrics"); !strings.Contains(body, `nftredir_reconcile_pods_total{outcome="in_sync"} 1`) || !strings.Contains(body, "nftredir_pods_enrolled 1") {
		t.Errorf("/metrics after the startup reconcile lacks the in-sync pod:\n%s", body)
	}
}

// Readiness under NRI enrolment: registered; with auto, whatever the
// runtime says (the CNI chain is the gate until the plugin registers).
func TestNRIReady(t *testing.T) {
	refused := nri.State{Refused: "containerd v2.1.4 has no NRI validator"}
	for _, c := range []struct {
		s    nri.State
		auto bool
		want string
	}{
		{nri.State{Registered: true}, false, ""},
		{refused, true, ""},
		{refused, false, "NRI enrolment refused: containerd v2.1.4"},
		{nri.State{Err: "dial unix /var/run/nri/nri.sock: connect: no such file or directory"}, true, ""},
		{nri.State{Err: "dial unix /var/run/nri/nri.sock: connect: no such file or directory"}, false, "not registered with the runtime's NRI: dial"},
		{nri.State{}, false, "not registered with the runtime's NRI yet"},
	} {
		err := nriReady(c.s, c.auto)
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("nriReady(%+v, auto %v) = %v; want %q", c.s, c.auto, err, c.want)
		}
	}
}

// The gate file follows the plugin: written once registered with a
// runtime whose validator holds pods back, kept while the connection is
// down (the validator is the gate then), removed once the runtime is
// refused.
func TestNoteGate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "nri-gate")
	log := hclog.NewNullLogger()
	gated := nri.GateOf("containerd", "v2.4.2", "v0.12.3")
	exists := func() bool { _, err := os.Stat(path); return err == nil }
	noteGate(path, nri.State{Gate: &gated}, log)
	if exists() {
		t.Fatal("gate file written before the plugin registered")
	}
	noteGate(path, nri.State{Registered: true, Gate: &gated}, log)
	if !exists() {
		t.Fatal("no gate file once registered")
	}
	noteGate(path, nri.State{Gate: &gated, Err: "the runtime closed the connection"}, log)
	if !exists() {
		t.Fatal("gate file removed when the connection ended")
	}
	old := nri.GateOf("containerd", "v2.1.4", "")
	noteGate(path, nri.State{Gate: &old, Refused: "containerd v2.1.4 has no NRI validator"}, log)
	if exists() {
		t.Fatal("gate file kept after the runtime was refused")
	}
}
