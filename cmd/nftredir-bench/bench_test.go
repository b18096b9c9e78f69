package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestQuickRun runs the whole benchmark in -quick mode against a freshly
// built nftredird, so that `make test` notices when the benchmark stops
// working (it is not timed: its numbers are not checked against targets).
func TestQuickRun(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	daemon := filepath.Join(dir, "nftredird")
	build := exec.Command(goTool(), "build", "-o", daemon, "github.com/nftredir/nftredir/cmd/nftredird")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nftredird: %v\n%s", err, out)
	}
	cniBin := cniPlugins(t, dir)
	out := filepath.Join(dir, "BENCHMARKS.md")
	svg := filepath.Join(dir, "docs", "latency.svg")
	// The plugin is its own baseline: the flag's path through the run
	// is what is tested.
	cfg, err := parseFlags([]string{"-quick", "-daemon", daemon, "-cni-bin", cniBin, "-out", out, "-svg", svg, "-baseline-cni", filepath.Join(cniBin, "nftredir-cni"),
		// One pod per variant: the last to start is nftredir-cni's, so
		// the cluster's teardown runs with nftredir-cni in the chain.
		"-podstart-pods", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, progress bytes.Buffer
	scratch := filepath.Join(os.TempDir(), "nftr-bench-tb-*")
	before, err := filepath.Glob(scratch)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := run(ctx, cfg, &stdout, &progress); err != nil {
		t.Fatalf("quick run: %v\nprogress:\n%s", err, progress.String())
	}
	t.Logf("quick run took %v", time.Since(start).Round(time.Millisecond))
	// The pod start section's scratch dirs go with the run, even when the
	// cluster's teardown still runs the plugin (which logs there).
	after, err := filepath.Glob(scratch)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range after {
		if !slices.Contains(before, d) {
			t.Errorf("the run left %s behind", d)
			os.RemoveAll(d)
		}
	}

	for _, want := range []string{"Targets", "iptables-restore", "nft -f", "CNI ADD as the runtime sees it", "nftredir-cni VERSION", "RemovePod over a warm connection", "Reconcile at scale", "Data path", "PASS", "baseline nftredir-cni's bare exec"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("printed report lacks %q:\n%s", want, stdout.String())
		}
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "](docs/latency.svg)") {
		t.Errorf("BENCHMARKS.md does not link the chart by its relative path")
	}
	chart, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if err := wellFormed(chart); err != nil {
		t.Errorf("chart is not well-formed XML: %v", err)
	}
	assertNothingLeft(t)
}

// cniPlugins makes a directory with a fresh nftredir-cni and the reference
// plugins hack/deps.sh installs in the repository's bin/.
func cniPlugins(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "cni-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command(goTool(), "build", "-o", filepath.Join(bin, "nftredir-cni"), "github.com/nftredir/nftredir/cmd/nftredir-cni")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nftredir-cni: %v\n%s", err, out)
	}
	repoBin, err := filepath.Abs(filepath.Join("..", "..", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bridge", "host-local"} {
		src := filepath.Join(repoBin, p)
		if _, err := os.Stat(src); err != nil {
			t.Fatalf("%s is missing: %v; run hack/deps.sh (make deps) to install the reference CNI plugins", src, err)
		}
		if err := os.Symlink(src, filepath.Join(bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// assertNothingLeft checks that the run removed every namespace and work
// directory it created.
func assertNothingLeft(t *testing.T) {
	t.Helper()
	mine := newPool().prefix
	for _, root := range []string{netnsDir, workRoot, diskRoot} {
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), mine) {
				t.Errorf("left behind: %s", filepath.Join(root, e.Name()))
			}
		}
	}
}

func wellFormed(b []byte) error {
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// goTool is the go command on PATH: the one that runs this test under
// make, so the daemon is built with the same toolchain.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

func TestQuantileIsNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 200; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	d := newDist(ds)
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, time.Millisecond}, {0.5, 100 * time.Millisecond}, {0.99, 198 * time.Millisecond}, {1, 200 * time.Millisecond}} {
		if got := d.q(c.p); got != c.want {
			t.Errorf("q(%v) = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestPairedRatiosMatchRepetitions(t *testing.T) {
	mk := func(rep int, p50 time.Duration) *sample {
		return &sample{rep: rep, lat: []time.Duration{p50}}
	}
	base := []*sample{mk(0, 30*time.Millisecond), mk(1, 40*time.Millisecond)}
	ours := []*sample{mk(1, 2*time.Millisecond), mk(0, time.Millisecond)}
	got := spreadOf(paired(base, ours, p50Of))
	if got.lo != 20 || got.hi != 30 || got.med != 25 {
		t.Errorf("paired ratios = %+v, want 20 and 30, median 25", got)
	}
}

func TestNiceTicks(t *testing.T) {
	got := niceTicks(0.7, 23)
	want := []float64{0.5, 1, 2, 5, 10, 20, 50}
	if len(got) != len(want) {
		t.Fatalf("niceTicks(0.7, 23) = %v, want %v", got, want)
	}
	for i := range want {
		if diff := got[i] - want[i]; diff > 1e-9 || diff < -1e-9 {
			t.Fatalf("niceTicks(0.7, 23) = %v, want %v", got, want)
		}
	}
}

func TestQuickDoesNotOverwriteTheReport(t *testing.T) {
	cfg, err := parseFlags([]string{"-quick"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.out != "" || cfg.svg != "" {
		t.Errorf("-quick writes %q and %q; a smoke run must not replace the committed report", cfg.out, cfg.svg)
	}
	if cfg.pods > 10 || cfg.cycles > 1000 || cfg.reconcilePods > 100 {
		t.Errorf("-quick is not quick: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"-quick", "-out", "x.md", "-pods", "7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.out != "x.md" || cfg.pods != 7 || cfg.svg != "" {
		t.Errorf("explicit flags must win over -quick: %+v", cfg)
	}
}
