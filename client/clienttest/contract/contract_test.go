package contract_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/client/clienttest"
	"github.com/nftredir/nftredir/client/clienttest/contract"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/server"
	"github.com/nftredir/nftredir/state"
)

// The fake: namespaces are paths it has never seen, and its node
// namespace is one it is told to protect, as the daemon is.
func TestFake(t *testing.T) {
	var n atomic.Int64
	contract.Run(t, func(t *testing.T) contract.Target {
		f := clienttest.New()
		const node = "/run/netns/contract-node"
		f.ProtectNetns(node)
		s := clienttest.Start(t, f)
		return contract.Target{
			API:       nftredirv1.NewRedirectServiceClient(dial(t, s.Socket)),
			NewNetns:  func(*testing.T) string { return fmt.Sprintf("/run/netns/contract-%d", n.Add(1)) },
			NodeNetns: node,
		}
	})
}

// The daemon's server, with its default config, on a Unix socket in a
// temp dir; the "node" is a namespace the test made and protects, so the
// machine's own namespace is never programmed.
func TestServer(t *testing.T) {
	nstest.RequirePrivileged(t)
	contract.Run(t, func(t *testing.T) contract.Target {
		node := nstest.NewNetns(t)
		guard, err := netns.NewGuard(node.Path)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		store, err := state.Open(filepath.Join(dir, "pods"), nil)
		if err != nil {
			t.Fatal(err)
		}
		pods, err := lifecycle.New(lifecycle.Config{Engine: capture.NewKernel(guard, nft.NewNetlink()), Store: store})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := server.New(server.Config{Pods: pods, ReconcileInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		socket := filepath.Join(dir, "nftredir.sock")
		lis, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Run(ctx, lis, 2*time.Second) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server Run: %v", err)
			}
		})
		conn := dial(t, socket)
		waitServing(t, conn)
		return contract.Target{
			API:       nftredirv1.NewRedirectServiceClient(conn),
			NewNetns:  func(t *testing.T) string { return nstest.NewNetns(t).Path },
			NodeNetns: node.Path,
		}
	})
}

func dial(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: nftredirv1.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			t.Fatalf("waiting for SERVING: %v", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}
