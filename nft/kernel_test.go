package nft_test

import (
	"context"
	"testing"

	"github.com/nftredir/nftredir/internal/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

func requireRoot(t testing.TB) { nstest.RequirePrivileged(t) }

// scratchNetns creates a namespace for the test (removed after it) and
// opens it through the guard, as the daemon would.
func scratchNetns(t *testing.T) (*nstest.Netns, *netns.Handle) {
	t.Helper()
	n := nstest.NewNetns(t)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return n, h
}

// TestKernelListingMatchesRendering applies each golden spec and checks that
// the kernel, listed by nft itself, holds exactly what String() renders.
func TestKernelListingMatchesRendering(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			n, h := scratchNetns(t)
			rs, err := nft.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
				t.Fatal(err)
			}
			if got, want := n.Nft(t, "list", "table", "inet", nft.TableName), rs.String(); got != want {
				t.Errorf("nft list differs from rendering\n--- nft list\n%s\n--- String()\n%s", got, want)
			}
			st, _, err := nft.NewNetlink().Verify(context.Background(), h, rs)
			if err != nil || st != nft.StatusInSync {
				t.Errorf("Verify after Apply = %v, %v; want in sync", st, err)
			}
		})
	}
}
