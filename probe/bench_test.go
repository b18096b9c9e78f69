package probe_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftredir/nftredir/probe"
)

// benchAddr is the i-th address of a /16 block, so crowds of pods never
// collide with the pods under test.
func benchAddr(block byte, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, block, byte(i >> 8), byte(i)})
}

// crowd enrols n pods, the node a benchmark runs on.
func crowd(b *testing.B, m *probe.Manager, prefix string, block byte, n int) {
	b.Helper()
	pods := make(map[string][]netip.Addr, n)
	for i := range n {
		pods[fmt.Sprintf("%s-%d", prefix, i)] = []netip.Addr{benchAddr(block+byte(i>>16), i)}
	}
	if err := m.Reconcile(context.Background(), pods); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAddWith1000 is AddPod's share on a node with 1,000 pods: one
// new pod's address added at a time, the set growing as it goes.
func BenchmarkAddWith1000(b *testing.B) {
	_, m := newNode(b, probe.Config{})
	ctx := context.Background()
	crowd(b, m, "crowd", 64, 1000)
	i := 0
	for b.Loop() {
		if err := m.Add(ctx, fmt.Sprintf("pod-%d", i), []netip.Addr{benchAddr(80+byte(i>>16), i)}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
}

// BenchmarkAddConcurrentWith1000 is 8 AddPods in flight on a node with
// 1,000 pods.
func BenchmarkAddConcurrentWith1000(b *testing.B) {
	_, m := newNode(b, probe.Config{})
	ctx := context.Background()
	crowd(b, m, "crowd", 64, 1000)
	var next atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1) - 1)
			if err := m.Add(ctx, fmt.Sprintf("pod-%d", i), []netip.Addr{benchAddr(80+byte(i>>16), i)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
}

// flush waits for queued removals; the benchmarks also run against the
// Manager before removals were queued, which had no Flush.
func flush(b *testing.B, m *probe.Manager) {
	if f, ok := any(m).(interface{ Flush(context.Context) error }); ok {
		if err := f.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRemoveConcurrent is 8 RemovePods in flight on a node where
// every removed pod was enrolled, until all removals are in the kernel.
func BenchmarkRemoveConcurrent(b *testing.B) {
	_, m := newNode(b, probe.Config{})
	ctx := context.Background()
	crowd(b, m, "pod", 80, b.N)
	var next atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1) - 1)
			if err := m.Remove(ctx, fmt.Sprintf("pod-%d", i)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	flush(b, m)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "removes/s")
}

// BenchmarkAddWhileRemoving is one AddPod at a time on a node with 1,000
// pods while another caller removes pods back to back, as when a
// deployment rolls.
func BenchmarkAddWhileRemoving(b *testing.B) {
	_, m := newNode(b, probe.Config{})
	ctx := context.Background()
	crowd(b, m, "crowd", 64, 1000)
	stop, stopped := make(chan struct{}), make(chan struct{})
	var removed atomic.Int64
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// The pod comes back with another address, so the set keeps
			// its size and every round deletes an element.
			uid := fmt.Sprintf("crowd-%d", i%1000)
			if err := m.Remove(ctx, uid); err != nil {
				b.Error(err)
				return
			}
			if err := m.Add(ctx, uid, []netip.Addr{benchAddr(64+8*byte(i/1000%2^1), i%1000)}); err != nil {
				b.Error(err)
				return
			}
			removed.Add(1)
			// A RemovePod does more than this; leave the Manager idle
			// between them, as the daemon would.
			time.Sleep(200 * time.Microsecond)
		}
	}()
	i := 0
	for b.Loop() {
		if err := m.Add(ctx, fmt.Sprintf("pod-%d", i), []netip.Addr{benchAddr(80+byte(i>>16), i)}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	close(stop)
	<-stopped
	b.ReportMetric(float64(removed.Load())/b.Elapsed().Seconds(), "removes/s")
}
