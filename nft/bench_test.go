package nft_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// The benchmarks time one pod's programming on a fresh namespace; creating
// the namespace is untimed. Run with a fixed count, e.g.
//
//	go test ./nft -run '^$' -bench . -benchtime 200x
//
// Each reports p50/p99 besides ns/op, since tail latency is what a pod
// start waits on. BenchmarkNftCLI is the baseline measured in the same run.

type freshNetns struct {
	name string
	h    *netns.Handle
}

func makeNetns(b *testing.B, g *netns.Guard) freshNetns {
	b.Helper()
	name := fmt.Sprintf("nftr-b-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		b.Fatalf("lo up: %v: %s", err, out)
	}
	h, err := g.Open("/run/netns/" + name)
	if err != nil {
		b.Fatal(err)
	}
	return freshNetns{name, h}
}

func (f freshNetns) drop() {
	f.h.Close()
	exec.Command("ip", "netns", "del", f.name).Run()
}

func benchPerNetns(b *testing.B, op func(f freshNetns) error) {
	requireRoot(b)
	g, err := netns.NewGuard()
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f := makeNetns(b, g)
		b.StartTimer()
		start := time.Now()
		err := op(f)
		lat = append(lat, time.Since(start))
		b.StopTimer()
		f.drop()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkApply: routing plus the table in one batch, as AddPod does.
func BenchmarkApply(b *testing.B) {
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	a := nft.NewNetlink()
	benchPerNetns(b, func(f freshNetns) error {
		if _, err := netns.EnsureRouting(f.h, netns.DefaultRouting()); err != nil {
			return err
		}
		return a.Apply(context.Background(), f.h, rs)
	})
}

// BenchmarkApplyRemove: enrol then release, the full lifecycle.
func BenchmarkApplyRemove(b *testing.B) {
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	a := nft.NewNetlink()
	ctx := context.Background()
	benchPerNetns(b, func(f freshNetns) error {
		if _, err := netns.EnsureRouting(f.h, netns.DefaultRouting()); err != nil {
			return err
		}
		if err := a.Apply(ctx, f.h, rs); err != nil {
			return err
		}
		if err := a.Remove(ctx, f.h); err != nil {
			return err
		}
		return netns.RemoveRouting(f.h, netns.DefaultRouting())
	})
}

// BenchmarkNftCLI is the baseline: the same ruleset through `nft -f` (an
// atomic replace too) plus the same rule and route through `ip`, the way a
// script-driven agent programs a pod.
func BenchmarkNftCLI(b *testing.B) {
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	script := fmt.Sprintf("table inet %[1]s\ndelete table inet %[1]s\n%s", nft.TableName, rs.String())
	benchPerNetns(b, func(f freshNetns) error {
		cmd := exec.Command("ip", "netns", "exec", f.name, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f: %v: %s", err, out)
		}
		if out, err := exec.Command("ip", "-n", f.name, "rule", "add", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100").CombinedOutput(); err != nil {
			return fmt.Errorf("ip rule: %v: %s", err, out)
		}
		if out, err := exec.Command("ip", "-n", f.name, "route", "replace", "local", "default", "dev", "lo", "table", "100").CombinedOutput(); err != nil {
			return fmt.Errorf("ip route: %v: %s", err, out)
		}
		return nil
	})
}

// BenchmarkVerify: one in-sync check of an applied table, what reconcile
// and GetPod pay per pod. The namespace and table are set up once.
func BenchmarkVerify(b *testing.B) {
	requireRoot(b)
	g, err := netns.NewGuard()
	if err != nil {
		b.Fatal(err)
	}
	f := makeNetns(b, g)
	defer f.drop()
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	a := nft.NewNetlink()
	ctx := context.Background()
	if err := a.Apply(ctx, f.h, rs); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		st, _, err := a.Verify(ctx, f.h, rs)
		if err != nil || st != nft.StatusInSync {
			b.Fatalf("Verify = %v, %v", st, err)
		}
	}
}

// BenchmarkApplyCounterCost: the table with its rules' counters and
// without them, each on a fresh namespace, alternating which goes first;
// reports both p50s and their ratio, measured in the same run.
func BenchmarkApplyCounterCost(b *testing.B) {
	requireRoot(b)
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	bare, err := rs.WithoutCounters()
	if err != nil {
		b.Fatal(err)
	}
	g, err := netns.NewGuard()
	if err != nil {
		b.Fatal(err)
	}
	a := nft.NewNetlink()
	lat := map[*nft.Ruleset][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		order := []*nft.Ruleset{rs, bare}
		if i%2 == 1 {
			order[0], order[1] = bare, rs
		}
		for _, r := range order {
			b.StopTimer()
			f := makeNetns(b, g)
			b.StartTimer()
			start := time.Now()
			err := a.Apply(context.Background(), f.h, r)
			lat[r] = append(lat[r], time.Since(start))
			b.StopTimer()
			f.drop()
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	with, without := p50(lat[rs]), p50(lat[bare])
	b.ReportMetric(with, "counters-p50-ms")
	b.ReportMetric(without, "bare-p50-ms")
	b.ReportMetric(with/without, "ratio")
}
