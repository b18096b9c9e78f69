package capture_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"testing"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// BenchmarkAddPod times what one AddPod asks of the engine for a new pod:
// open its namespace, apply routing and table, inspect the result, close.
// Creating and deleting the namespace is untimed. Count the namespace
// entries with
//
//	go test -c ./capture && strace -f -e trace=setns,execve -o trace ./capture.test \
//	    -test.run '^$' -test.bench AddPod -test.benchtime 100x
//
// and drop the setns lines of the processes that exec'd ip.
func BenchmarkAddPod(b *testing.B) {
	nstest.RequirePrivileged(b)
	g, err := netns.NewGuard()
	if err != nil {
		b.Fatal(err)
	}
	e := capture.NewKernel(g, nft.NewNetlink())
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	r := netns.DefaultRouting()
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		name := fmt.Sprintf("%sb%08x", nstest.NamePrefix, rand.Uint32())
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			b.Fatalf("ip netns add: %v: %s", err, out)
		}
		b.StartTimer()
		err := addPod(ctx, e, "/run/netns/"+name, rs, r)
		b.StopTimer()
		exec.Command("ip", "netns", "del", name).Run()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func addPod(ctx context.Context, e capture.Engine, path string, rs *nft.Ruleset, r netns.Routing) error {
	ns, err := e.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	if _, err := ns.Apply(ctx, rs, r); err != nil {
		return err
	}
	l, err := ns.Inspect(ctx, rs, r)
	if err != nil {
		return err
	}
	if !l.InSync() {
		return fmt.Errorf("not in sync after Apply: %v, %+v", l.Table, l.Routing)
	}
	return nil
}

// BenchmarkOpenInspect times what a reconcile pass or GetPod pays per
// enrolled pod: open its namespace, compare table and routing, close.
func BenchmarkOpenInspect(b *testing.B) {
	nstest.RequirePrivileged(b)
	g, err := netns.NewGuard()
	if err != nil {
		b.Fatal(err)
	}
	e := capture.NewKernel(g, nft.NewNetlink())
	rs, err := nft.Build(nft.DefaultSpec("bench-pod"))
	if err != nil {
		b.Fatal(err)
	}
	r := netns.DefaultRouting()
	ctx := context.Background()
	name := fmt.Sprintf("%sb%08x", nstest.NamePrefix, rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	path := "/run/netns/" + name
	if err := addPod(ctx, e, path, rs, r); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		ns, err := e.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		l, err := ns.Inspect(ctx, rs, r)
		ns.Close()
		if err != nil || !l.InSync() {
			b.Fatalf("Inspect = %v, %+v, %v", l.Table, l.Routing, err)
		}
	}
}
