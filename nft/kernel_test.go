package nft_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// requireRoot fails (rather than skips) without root: these tests are the
// proof that the ruleset works in a real kernel, and a silent skip would
// hide that they never ran. NFTREDIR_SKIP_PRIVILEGED=1 opts out explicitly.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("NFTREDIR_SKIP_PRIVILEGED") == "1" {
		t.Skip("NFTREDIR_SKIP_PRIVILEGED=1")
	}
	if os.Geteuid() != 0 {
		t.Fatal("kernel tests need root (network namespaces, nftables); run as root or set NFTREDIR_SKIP_PRIVILEGED=1")
	}
}

// scratchNetns creates a named namespace for the test and removes it after.
func scratchNetns(t *testing.T) *netns.Handle {
	t.Helper()
	requireRoot(t)
	name := fmt.Sprintf("nftr-k-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func nftList(t *testing.T, h *netns.Handle) string {
	t.Helper()
	name := strings.TrimPrefix(h.Path(), "/run/netns/")
	out, err := exec.Command("ip", "netns", "exec", name, "nft", "list", "table", "inet", nft.TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

// TestKernelListingMatchesRendering applies each golden spec and checks that
// the kernel, listed by nft itself, holds exactly what String() renders.
func TestKernelListingMatchesRendering(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			h := scratchNetns(t)
			rs, err := nft.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
				t.Fatal(err)
			}
			if got, want := nftList(t, h), rs.String(); got != want {
				t.Errorf("nft list differs from rendering\n--- nft list\n%s\n--- String()\n%s", got, want)
			}
			st, _, err := nft.NewNetlink().Verify(context.Background(), h, rs)
			if err != nil || st != nft.StatusInSync {
				t.Errorf("Verify after Apply = %v, %v; want in sync", st, err)
			}
		})
	}
}
