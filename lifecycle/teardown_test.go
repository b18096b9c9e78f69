package lifecycle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// openHook runs hook once, on the first Open of path after it is armed.
type openHook struct {
	capture.Engine
	mu   sync.Mutex
	path string
	hook func()
}

func (o *openHook) Open(path string) (capture.Namespace, error) {
	o.mu.Lock()
	hook := o.hook
	if path == o.path {
		o.hook = nil
	}
	o.mu.Unlock()
	if path == o.path && hook != nil {
		hook()
	}
	return o.Engine.Open(path)
}

// A settle that finds the namespace unclaimed (a path that dropped the
// claim early) races another pod's AddPod into it: whichever wins, the
// other pod's capture survives the settle.
func TestSettleRacingAnotherPodsAddPod(t *testing.T) {
	ctx := context.Background()
	fake := capturetest.NewFake()
	ns := "/run/netns/settle-race"
	id := fake.AddNamespace(ns)
	hooked := &openHook{Engine: fake}
	store, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Engine: hooked, Store: store, TeardownGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.StopTeardowns()
	if _, err := m.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: "pod-1", NetnsPath: ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.RemovePod(ctx, &nftredirv1.RemovePodRequest{PodUid: "pod-1", NamespaceTeardown: true}); err != nil {
		t.Fatal(err)
	}
	m.owners.release(id, "pod-1")
	var addErr error
	hooked.mu.Lock()
	hooked.path, hooked.hook = ns, func() {
		_, addErr = m.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: "pod-2", NetnsPath: ns})
	}
	hooked.mu.Unlock()
	if _, err := m.RemovePod(ctx, &nftredirv1.RemovePodRequest{PodUid: "pod-1"}); err != nil {
		t.Fatalf("plain RemovePod settling the leftover: %v", err)
	}
	if left, _ := store.Leftovers(); len(left) != 0 {
		t.Fatalf("%d leftovers after the settle", len(left))
	}
	if addErr != nil {
		if Classify(addErr).Kind != KindPrecondition {
			t.Fatalf("pod-2's AddPod during the settle: %v; want success or a precondition refusal", addErr)
		}
		if _, err := m.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: "pod-2", NetnsPath: ns}); err != nil {
			t.Fatalf("pod-2's AddPod after the settle: %v", err)
		}
	}
	resp, err := m.GetPod(ctx, "pod-2")
	if err != nil || resp.SyncStatus != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Fatalf("pod-2 after pod-1's settle: %v, %v; want it enrolled and in sync", resp.GetSyncStatus(), err)
	}
}
