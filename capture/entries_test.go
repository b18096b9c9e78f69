package capture_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// entriesChildEnv names the namespace the child of
// TestOneNamespaceEntryPerAddPod works on.
const entriesChildEnv = "NFTREDIR_TEST_ENTRIES_NETNS"

// TestOneNamespaceEntryPerAddPod counts, with strace, the setns calls of
// one AddPod's engine work (Open, Apply, Inspect, Owner, Close) in a
// child process: one entry into the namespace and one return.
func TestOneNamespaceEntryPerAddPod(t *testing.T) {
	if path := os.Getenv(entriesChildEnv); path != "" {
		if err := addPodAndOwner(path); err != nil {
			t.Fatal(err)
		}
		return
	}
	env := capturetest.NewKernelEnv(t)
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace is not installed")
	}
	path := env.NewNamespace(t)
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(strace, "-f", "-qq", "-e", "trace=setns,unshare", "-o", trace,
		os.Args[0], "-test.run", "^TestOneNamespaceEntryPerAddPod$", "-test.count", "1")
	cmd.Env = append(os.Environ(), entriesChildEnv+"="+path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child under strace: %v\n%s", err, out)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	probe := false
	for l := range strings.Lines(string(b)) {
		switch {
		case strings.Contains(l, "unshare("):
			// The guard's one check of the kernel, on a namespace of its
			// own (netns.cookieByID): its return home is not the
			// AddPod's.
			probe = true
		case strings.Contains(l, "setns(") && probe:
			probe = false
		case strings.Contains(l, "setns("):
			calls = append(calls, strings.TrimSpace(l))
		}
	}
	if len(calls) != 2 {
		t.Errorf("%d setns calls, want 2 (into the namespace and back):\n%s", len(calls), strings.Join(calls, "\n"))
	}
	ns, err := env.Engine().Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	l, err := ns.Inspect(context.Background(), mustBuild(t), netns.DefaultRouting())
	if err != nil || !l.InSync() {
		t.Errorf("the child's AddPod did not take: %v, %+v, %v", l.Table, l.Routing, err)
	}
}

func mustBuild(t *testing.T) *nft.Ruleset {
	t.Helper()
	rs, err := nft.Build(nft.DefaultSpec("entries-pod"))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func addPodAndOwner(path string) error {
	g, err := netns.NewGuard()
	if err != nil {
		return err
	}
	e := capture.NewKernel(g, nft.NewNetlink())
	rs, err := nft.Build(nft.DefaultSpec("entries-pod"))
	if err != nil {
		return err
	}
	ctx, r := context.Background(), netns.DefaultRouting()
	ns, err := e.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	if _, err := ns.Apply(ctx, rs, r); err != nil {
		return err
	}
	if _, err := ns.Inspect(ctx, rs, r); err != nil {
		return err
	}
	_, _, err = ns.Owner(ctx)
	return err
}
