package lifecycle

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/nftredir/nftredir/capture/capturetest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// BenchmarkAddPodPath times the daemon's own part of an AddPod of a new
// pod with every option a CNI configuration sets: validation, the ruleset
// build, the record written (on tmpfs when /dev/shm is there, as the
// default state dir is), the engine's work done by the fake in memory.
// What it adds to the kernel phases is what the daemon's code costs.
func BenchmarkAddPodPath(b *testing.B) {
	dir := b.TempDir()
	if _, err := os.Stat("/dev/shm"); err == nil {
		d, err := os.MkdirTemp("/dev/shm", "nftredir-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	store, err := state.Open(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	fake := capturetest.NewFake()
	m, err := New(Config{Engine: fake, Store: store})
	if err != nil {
		b.Fatal(err)
	}
	defer m.StopTeardowns()
	ctx := context.Background()
	opts := &nftredirv1.RedirectOptions{
		ExcludeInboundPorts:  []uint32{22, 8080},
		ExcludeOutboundPorts: []uint32{443},
		ExcludeOutboundCidrs: []string{"10.0.0.0/8", "169.254.169.254"},
	}
	i := 0
	for b.Loop() {
		b.StopTimer()
		uid := fmt.Sprintf("bench-%d", i)
		path := "/run/netns/" + uid
		fake.AddNamespace(path)
		i++
		b.StartTimer()
		if _, err := m.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: uid, PodName: "web", PodNamespace: "shop", NetnsPath: path, PodIps: []string{"10.244.0.7"}, Options: opts}); err != nil {
			b.Fatal(err)
		}
	}
}
