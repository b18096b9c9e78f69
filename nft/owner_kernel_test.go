package nft_test

import (
	"context"
	"testing"

	"github.com/nftredir/nftredir/nft"
)

// TestKernelOwner: Owner names the pod a table was built for, and nobody
// once a rule without our comment is in it.
func TestKernelOwner(t *testing.T) {
	n, h := scratchNetns(t)
	ctx := context.Background()
	a := nft.NewNetlink()
	check := func(wantPod string, wantExists bool) {
		t.Helper()
		pod, exists, err := a.Owner(ctx, h)
		if err != nil || pod != wantPod || exists != wantExists {
			t.Errorf("Owner = %q, %v, %v; want %q, %v", pod, exists, err, wantPod, wantExists)
		}
	}
	check("", false)
	rs, err := nft.Build(nft.DefaultSpec("pod-7"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(ctx, h, rs); err != nil {
		t.Fatal(err)
	}
	check("pod-7", true)
	n.Nft(t, "add", "rule", "inet", nft.TableName, "nat-output", "counter")
	check("", true)
	if err := a.Remove(ctx, h); err != nil {
		t.Fatal(err)
	}
	check("", false)
}
