package nft_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/nftredir/nftredir/nft"
)

// TestRefusedBatchKeepsHandleUsable: the kernel refuses a batch (a jump
// to a chain that does not exist), which leaves the table as it was. The
// handle's sockets outlive single calls now, so the same handle must then
// verify, apply and read the owner normally.
func TestRefusedBatchKeepsHandleUsable(t *testing.T) {
	_, h := scratchNetns(t)
	ctx, a := context.Background(), nft.NewNetlink()
	good, err := nft.Build(nft.DefaultSpec("0b6f3c1e-pod"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(ctx, h, good); err != nil {
		t.Fatal(err)
	}
	bad := *good
	bad.Chains = slices.Clone(good.Chains)
	bad.Chains[0].Rules = append(slices.Clone(good.Chains[0].Rules), nft.Rule{
		Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "no-such-chain"}},
		Text:  "jump no-such-chain",
	})
	if err := a.Apply(ctx, h, &bad); err == nil {
		t.Fatal("Apply of a jump to a missing chain succeeded")
	}
	if st, text, err := a.Verify(ctx, h, good); err != nil || st != nft.StatusInSync {
		t.Fatalf("after the refused batch: Verify = %v, %v\n%s", st, err, text)
	}
	other := nft.DefaultSpec("0b6f3c1e-pod")
	other.ExcludeInboundPorts = []uint16{8080}
	rs, err := nft.Build(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(ctx, h, rs); err != nil {
		t.Fatalf("Apply after the refused batch: %v", err)
	}
	if st, _, err := a.Verify(ctx, h, rs); err != nil || st != nft.StatusInSync {
		t.Errorf("Verify = %v, %v; want in sync", st, err)
	}
	if pod, ok, err := a.Owner(ctx, h); err != nil || !ok || pod != "0b6f3c1e-pod" {
		t.Errorf("Owner = %q, %t, %v", pod, ok, err)
	}
}
