package probe_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/nftredir/nftredir/probe"
)

// enrol reconciles n pods, pod-<i> owning 10.<block>.x.y, and returns what
// the sets then hold.
func enrol(t testing.TB, m *probe.Manager, block byte, n int) map[netip.Addr]string {
	t.Helper()
	pods := make(map[string][]netip.Addr, n)
	want := make(map[netip.Addr]string, n)
	for i := range n {
		uid, a := fmt.Sprintf("pod-%d", i), benchAddr(block, i)
		pods[uid] = []netip.Addr{a}
		want[a] = uid
	}
	if err := m.Reconcile(context.Background(), pods); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestKernelAddSendsOnlyItsOwnElement: with 1,000 pods in the set, an Add
// neither lists the set nor sends more than its own element, however many
// pods there are.
func TestKernelAddSendsOnlyItsOwnElement(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	want := enrol(t, m, 64, 1000)
	before := probe.CountsOf(m)
	const adds = 1000
	for i := range adds {
		uid, a := fmt.Sprintf("new-%d", i), benchAddr(80, i)
		if err := m.Add(ctx, uid, []netip.Addr{a}); err != nil {
			t.Fatal(err)
		}
		want[a] = uid
	}
	got := probe.CountsOf(m)
	if got.Reads != before.Reads {
		t.Errorf("%d adds read the node table %d times; want none", adds, got.Reads-before.Reads)
	}
	if b, e := got.Batches-before.Batches, got.Elements-before.Elements; b != adds || e != adds {
		t.Errorf("%d adds sent %d batches with %d element changes; want one batch of one element each", adds, b, e)
	}
	// Adding what the kernel already holds sends nothing.
	if err := m.Add(ctx, "new-0", []netip.Addr{benchAddr(80, 0)}); err != nil {
		t.Fatal(err)
	}
	if after := probe.CountsOf(m); after != got {
		t.Errorf("a repeated Add changed the counts from %+v to %+v", got, after)
	}
	wantElements(t, node, m, want)
}

// TestKernelRemovesShareBatches: removals queued while the Manager is busy
// go to the kernel together, and Remove does not wait for them.
func TestKernelRemovesShareBatches(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	const pods = 500
	enrol(t, m, 64, pods)
	before := probe.CountsOf(m)

	release := probe.HoldKernel(m)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < pods; i += 8 {
				if err := m.Remove(ctx, fmt.Sprintf("pod-%d", i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	// Returning while the kernel is held: no Remove waited for it.
	wg.Wait()
	release()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := probe.CountsOf(m)
	if b := got.Batches - before.Batches; b != 1 {
		t.Errorf("%d removals queued behind a busy Manager went in %d batches; want 1", pods, b)
	}
	if got.Reads != before.Reads {
		t.Errorf("removals read the node table %d times; want none", got.Reads-before.Reads)
	}
	wantElements(t, node, m, map[netip.Addr]string{})
}

// TestKernelConcurrentRemovesFreeRunning: without holding anything back,
// many concurrent removals still take far fewer batches than removals.
func TestKernelConcurrentRemovesFreeRunning(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	const pods = 1000
	enrol(t, m, 64, pods)
	before := probe.CountsOf(m)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < pods; i += 8 {
				if err := m.Remove(ctx, fmt.Sprintf("pod-%d", i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	b := probe.CountsOf(m).Batches - before.Batches
	t.Logf("%d concurrent removals: %d batches", pods, b)
	if b > pods/4 {
		t.Errorf("%d concurrent removals took %d batches; want at most %d", pods, b, pods/4)
	}
	wantElements(t, node, m, map[netip.Addr]string{})
}

// TestKernelReusedAddressSurvivesQueuedRemoval: pod A's removal is queued,
// then pod B claims A's address before the batch goes out: the address
// ends up B's, whether A's removal was still queued or already planned.
func TestKernelReusedAddressSurvivesQueuedRemoval(t *testing.T) {
	ctx := context.Background()
	t.Run("queued", func(t *testing.T) {
		node, m := newNode(t, probe.Config{})
		if err := m.Add(ctx, podA, []netip.Addr{ip4, ip4b}); err != nil {
			t.Fatal(err)
		}
		release := probe.HoldKernel(m)
		if err := m.Remove(ctx, podA); err != nil {
			t.Fatal(err)
		}
		added := make(chan error, 1)
		go func() { added <- m.Add(ctx, podB, []netip.Addr{ip4}) }()
		select {
		case err := <-added:
			t.Fatalf("Add returned (%v) before the kernel could have its element", err)
		case <-time.After(50 * time.Millisecond):
		}
		release()
		if err := <-added; err != nil {
			t.Fatal(err)
		}
		// B's Add returned: its element is in the kernel already.
		if got := nftElements(t, node)[ip4]; got != podB {
			t.Errorf("after Add(B) returned, %s is owned by %q; want %s", ip4, got, podB)
		}
		wantElements(t, node, m, map[netip.Addr]string{ip4: podB})
	})
	t.Run("planned", func(t *testing.T) {
		node, m := newNode(t, probe.Config{})
		if err := m.Add(ctx, podA, []netip.Addr{ip4, ip4b}); err != nil {
			t.Fatal(err)
		}
		// The next batch (A's removal) stops between planning and sending.
		planned, proceed := make(chan struct{}), make(chan struct{})
		var once sync.Once
		probe.BeforeSend(m, func() {
			once.Do(func() {
				close(planned)
				<-proceed
			})
		})
		if err := m.Remove(ctx, podA); err != nil {
			t.Fatal(err)
		}
		<-planned
		added := make(chan error, 1)
		go func() { added <- m.Add(ctx, podB, []netip.Addr{ip4}) }()
		time.Sleep(20 * time.Millisecond)
		close(proceed)
		if err := <-added; err != nil {
			t.Fatal(err)
		}
		wantElements(t, node, m, map[netip.Addr]string{ip4: podB})
	})
	t.Run("churn", func(t *testing.T) {
		node, m := newNode(t, probe.Config{})
		owner := ""
		for i := range 200 {
			uid := fmt.Sprintf("pod-%d", i)
			if err := m.Add(ctx, uid, []netip.Addr{ip4}); err != nil {
				t.Fatal(err)
			}
			if owner != "" {
				// The old pod goes after the new one took its address.
				if err := m.Remove(ctx, owner); err != nil {
					t.Fatal(err)
				}
			}
			owner = uid
			if i%50 != 0 {
				continue
			}
			if got := nftElements(t, node)[ip4]; got != owner {
				t.Fatalf("round %d: %s owned by %q, want %s", i, ip4, got, owner)
			}
		}
		wantElements(t, node, m, map[netip.Addr]string{ip4: owner})
	})
}

// TestKernelRefusedBatchResyncs: a batch that the kernel refuses because
// the table changed under the Manager is planned again from a reading, and
// everything the Manager knows comes back.
func TestKernelRefusedBatchResyncs(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(ctx, podA, []netip.Addr{ip4, ip6}); err != nil {
		t.Fatal(err)
	}
	// Someone deleted A's element: deleting it again is refused.
	node.Nft(t, "delete", "element", "inet", probe.TableName, probe.SetV4, "{ "+ip4.String()+" }")
	before := probe.CountsOf(m)
	if err := m.Remove(ctx, podA); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{})
	if r := probe.CountsOf(m).Reads - before.Reads; r != 1 {
		t.Errorf("the refused removal read the node table %d times; want 1", r)
	}

	// The whole ruleset flushed: the next Add fails, then recreates the
	// table with every pod the Manager knows.
	if err := m.Add(ctx, podA, []netip.Addr{ip4}); err != nil {
		t.Fatal(err)
	}
	node.Nft(t, "flush", "ruleset")
	if err := m.Add(ctx, podB, []netip.Addr{ip4b}); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podA, ip4b: podB})
	if p, err := m.Problems(ctx); err != nil || len(p) > 0 {
		t.Errorf("Problems after the resync = %v, %v", p, err)
	}
}

// TestKernelReconcileRealignsMemory: after Reconcile repairs what others
// did to the sets, the Manager plans against the repaired sets: later
// calls need no reading and remove exactly what they should.
func TestKernelReconcileRealignsMemory(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	pods := map[string][]netip.Addr{podA: {ip4, ip6}, podB: {ip4b}}
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	node.Nft(t, "flush", "ruleset")
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	// A stranger rewrote B's element and added one of its own.
	node.Nft(t, "delete", "element", "inet", probe.TableName, probe.SetV4, "{ "+ip4b.String()+" }")
	node.Nft(t, "add", "element", "inet", probe.TableName, probe.SetV4, "{ "+ip4b.String()+` comment "stranger" }`)
	node.Nft(t, "add", "element", "inet", probe.TableName, probe.SetV4, `{ 10.77.0.1 comment "stranger" }`)
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podA, ip6: podA, ip4b: podB})

	before := probe.CountsOf(m)
	if err := m.Remove(ctx, podB); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(ctx, podB, []netip.Addr{ip4}); err != nil {
		t.Fatal(err)
	}
	wantElements(t, node, m, map[netip.Addr]string{ip4: podB, ip6: podA})
	if got := probe.CountsOf(m); got.Reads != before.Reads {
		t.Errorf("calls after Reconcile read the node table %d times; want none", got.Reads-before.Reads)
	}
}

// TestKernelCloseDrainsRemovals: removals still queued when the daemon
// stops reach the kernel; calls after Close fail.
func TestKernelCloseDrainsRemovals(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	const pods = 200
	enrol(t, m, 64, pods)
	release := probe.HoldKernel(m)
	for i := range pods {
		if err := m.Remove(ctx, fmt.Sprintf("pod-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	time.Sleep(20 * time.Millisecond)
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if got := nftElements(t, node); len(got) != 0 {
		t.Errorf("%d elements left after Close; want none", len(got))
	}
	if err := m.Add(ctx, podA, []netip.Addr{ip4}); err == nil {
		t.Error("Add after Close succeeded")
	}
	if err := m.Remove(ctx, podA); err == nil {
		t.Error("Remove after Close succeeded")
	}
	if _, err := m.Elements(ctx); err != nil {
		t.Errorf("Elements after Close: %v", err)
	}
}

// readElements reads the node sets, again when a read does not match
// want: a dump of thousands of elements came back short once in a loaded
// CI run (5825 of 6000) while every later read was whole, so a short read
// is logged and the sets are read once more before the test judges what
// was written.
func readElements(t *testing.T, m *probe.Manager, want map[netip.Addr]string) map[netip.Addr]string {
	t.Helper()
	var got map[netip.Addr]string
	for try := range 3 {
		var err error
		if got, err = m.Elements(context.Background()); err != nil {
			t.Fatal(err)
		}
		if maps.Equal(got, want) {
			return got
		}
		t.Logf("read %d of the node sets: %d elements, want %d", try+1, len(got), len(want))
	}
	return got
}

// TestKernelLargeBatches: a reconcile or a coalesced removal of thousands
// of pods goes in one batch, split into messages the kernel accepts.
func TestKernelLargeBatches(t *testing.T) {
	node, m := newNode(t, probe.Config{})
	ctx := context.Background()
	const n = 3000
	pods := map[string][]netip.Addr{}
	want := map[netip.Addr]string{}
	for i := range n {
		// Long UIDs make the biggest messages.
		uid := fmt.Sprintf("%036d-%090d", i, i)
		a4 := benchAddr(64, i)
		a6 := netip.AddrFrom16([16]byte{0xfd, 0, 0x99, 14: byte(i >> 8), 15: byte(i)})
		pods[uid] = []netip.Addr{a4, a6}
		want[a4], want[a6] = uid, uid
	}
	if err := m.Reconcile(ctx, pods); err != nil {
		t.Fatal(err)
	}
	got := readElements(t, m, want)
	if !maps.Equal(got, want) {
		t.Fatalf("after Reconcile of %d pods: %d elements, want %d", n, len(got), len(want))
	}
	// Recreated from scratch: the sets' seeds are that large too.
	node.Nft(t, "flush", "ruleset")
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readElements(t, m, want); !maps.Equal(got, want) {
		t.Fatalf("after recreating the sets: %d elements, want %d", len(got), len(want))
	}
	release := probe.HoldKernel(m)
	for uid := range pods {
		if err := m.Remove(ctx, uid); err != nil {
			t.Fatal(err)
		}
	}
	release()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Elements(ctx); err != nil || len(got) != 0 {
		t.Errorf("after removing every pod: %d elements (%v), want none", len(got), err)
	}
}
