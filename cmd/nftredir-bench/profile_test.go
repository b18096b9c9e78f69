package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/probe"
	"github.com/nftredir/nftredir/server"
	"github.com/nftredir/nftredir/state"
)

// BenchmarkAddPodInProcess is the daemon's AddPod path with the server in
// this process, so that a CPU profile sees it whole (client, gRPC, server,
// netlink, state store), e.g.
//
//	go test ./cmd/nftredir-bench -run '^$' -bench AddPodInProcess -benchtime 400x -cpuprofile cpu.prof
//	go tool pprof -top -cum cpu.prof
//
// It is built like cmd/nftredird's serve (node probe table in a namespace
// standing in for the node, JSON logging at info, discarded) and runs one
// call at a time (NFTREDIR_BENCH_CONC sets how many are in flight).
// Namespaces are created before the timer starts.
func BenchmarkAddPodInProcess(b *testing.B) {
	nstest.RequirePrivileged(b)
	conc := 1
	if v := benchConc(); v > 0 {
		conc = v
	}
	p := newPool()
	b.Cleanup(func() { p.removeAll() })
	names, err := p.create(b.N, "i")
	if err != nil {
		b.Fatal(err)
	}
	// tmpfs, like the daemon's /run on a node: on a disk the state
	// store's fsyncs would dominate the profile.
	dir, err := newWorkDir(true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { removeWorkDir(dir) })
	// A namespace of ours stands in for the node, as in the benchmark.
	node, err := p.create(1, "inode")
	if err != nil {
		b.Fatal(err)
	}
	guard, err := netns.NewGuard(nsPath(node[0]))
	if err != nil {
		b.Fatal(err)
	}
	pm, err := probe.New(probe.Config{NetnsPath: nsPath(node[0])})
	if err != nil {
		b.Fatal(err)
	}
	if err := pm.Ensure(context.Background()); err != nil {
		b.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, JSONFormat: true, Output: io.Discard})
	store, err := state.Open(filepath.Join(dir, "state"), log)
	if err != nil {
		b.Fatal(err)
	}
	pods, err := lifecycle.New(lifecycle.Config{Engine: capture.NewKernel(guard, nft.NewNetlink()), Store: store, Logger: log, Probe: pm})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := server.New(server.Config{Pods: pods, Logger: log, ReconcileInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx, lis, time.Second) })
	b.Cleanup(func() { cancel(); wg.Wait() })
	c, err := client.Dial(ctx, sock)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for {
		h, err := c.Health(ctx)
		if err == nil && h.Serving() {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	err = parallel(ctx, b.N, conc, func(i int) error {
		_, err := c.AddPod(ctx, addRequest(fmt.Sprintf("inproc-%d", i), names[i], podIP(names[i])))
		return err
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pods/s")
}

func benchConc() int {
	var n int
	fmt.Sscan(os.Getenv("NFTREDIR_BENCH_CONC"), &n)
	return n
}
