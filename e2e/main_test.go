package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// grpcurlTranscript, when set, makes TestDaemonGrpcurl write its session as
// Markdown there (docs/grpcurl.md is made this way).
var grpcurlTranscript = flag.String("grpcurl-transcript", "", "write the grpcurl session of TestDaemonGrpcurl as Markdown to this file")

// binDir holds the binaries built for this run. It is made in TestMain so
// that it is removed after every test, but filled only when a test asks
// (binaries), so data-path tests that run no binary pay no build.
var binDir string

func TestMain(m *testing.M) {
	// The probe SNAT test re-executes this binary as another uid to dial.
	if code, ok := nstest.RunDialChild(); ok {
		os.Exit(code)
	}
	flag.Parse()
	dir, err := os.MkdirTemp("", "nftredir-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	// Traversable by everyone: TestDaemonAllowlist runs nftredirctl as
	// unprivileged uids.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Binaries are the product's executables, built once per test run from the
// working tree.
type Binaries struct {
	Daemon, Ctl string
	// CNI is the nftredir-cni plugin, CNIHelper the nftredir-cni-helper
	// beside it (its installer, and its API lookup when the daemon
	// cannot answer).
	CNI, CNIHelper string
	// Grpcurl is the pinned grpcurl that hack/deps.sh installs.
	Grpcurl string
	Repo    string
}

var (
	buildOnce sync.Once
	buildErr  error
)

// binaries builds nftredird, nftredirctl, nftredir-cni and its helper on first use and
// returns their paths.
func binaries(t testing.TB) Binaries {
	t.Helper()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("no go command on PATH to build the binaries: %w", err)
			return
		}
		// As make build does: static, stripped, and stamped for --version.
		ldflags, err := exec.Command(filepath.Join(repo, "hack", "ldflags.sh")).Output()
		if err != nil {
			buildErr = fmt.Errorf("hack/ldflags.sh: %v", err)
			return
		}
		cmd := exec.Command(goBin, "build", "-buildvcs=auto", "-ldflags", strings.TrimSpace(string(ldflags)),
			"-o", binDir+"/", "./cmd/nftredird", "./cmd/nftredirctl", "./cmd/nftredir-cni", "./cmd/nftredir-cni/nftredir-cni-helper")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/nftredird ./cmd/nftredirctl ./cmd/nftredir-cni ./cmd/nftredir-cni/nftredir-cni-helper: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return Binaries{
		Daemon:    filepath.Join(binDir, "nftredird"),
		Ctl:       filepath.Join(binDir, "nftredirctl"),
		CNI:       filepath.Join(binDir, "nftredir-cni"),
		CNIHelper: filepath.Join(binDir, "nftredir-cni-helper"),
		Grpcurl:   filepath.Join(repo, "bin", "grpcurl"),
		Repo:      repo,
	}
}

var (
	testHookOnce sync.Once
	testHookBin  string
	testHookErr  error
)

// testHookDaemon builds nftredird with the nftredir_testhooks tag, which
// honours variables a product build has not (NFTREDIR_TEST_NRI_DELAY),
// and returns its path.
func testHookDaemon(t testing.TB) string {
	t.Helper()
	b := binaries(t)
	testHookOnce.Do(func() {
		out := filepath.Join(binDir, "nftredird-testhooks")
		cmd := exec.Command("go", "build", "-tags", "nftredir_testhooks", "-o", out, "./cmd/nftredird")
		cmd.Dir = b.Repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := cmd.CombinedOutput(); err != nil {
			testHookErr = fmt.Errorf("go build -tags nftredir_testhooks ./cmd/nftredird: %v\n%s", err, o)
			return
		}
		testHookBin = out
	})
	if testHookErr != nil {
		t.Fatal(testHookErr)
	}
	return testHookBin
}
