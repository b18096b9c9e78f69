// Package nstest builds throwaway network namespaces for tests that need a
// real kernel: a pod and a peer joined by a veth pair, listeners inside
// them, and sockets dialled from them. Tests may drive the ip and nft
// binaries through it to set up and observe; product code never does.
//
// Everything it creates is registered with t.Cleanup, so namespaces, links
// and processes go away even when a test fails. The test's goroutines
// and its main thread never change namespace: work that must happen
// inside one runs on a dedicated, locked OS thread that enters it.
package nstest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"

	"github.com/nftredir/nftredir/internal/testkit/testenv"
)

// SkipEnv names the environment variable that turns the privileged tests
// into skips, for machines where nobody can be root.
const SkipEnv = "NFTREDIR_SKIP_PRIVILEGED"

// NamePrefix starts the name of every namespace this package creates, so
// leftovers are recognisable in `ip netns list`.
const NamePrefix = "nftr-"

// RequirePrivileged skips t unless the process is root, and always when
// SkipEnv=1, so a plain `go test ./...` as a normal user runs the pure
// tests and says which it skipped. Under CI (CI=true) a non-root run fails
// instead: there a silently skipped data-path suite would look exactly
// like a passing one.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	// The opt-out wins even for root, so `make unit` runs only pure tests
	// wherever it is run.
	if os.Getenv(SkipEnv) == "1" {
		t.Skipf("needs root and a kernel; skipped because %s=1", SkipEnv)
	}
	if os.Geteuid() == 0 {
		return
	}
	testenv.Missing(t, "needs root for network namespaces, links, nftables rules or socket ownership "+
		"(it runs as uid %d); run it with sudo, or set %s=1 to skip it quietly", os.Geteuid(), SkipEnv)
}

// Netns is a named network namespace created for one test.
type Netns struct {
	Name string
	// Path is the bind mount `ip netns add` creates, /run/netns/<Name>.
	Path string
}

// NewNetns creates a namespace with a unique name and loopback up. It is
// deleted when the test ends, which also destroys the links inside it.
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	RequirePrivileged(t)
	n := &Netns{Name: uniqueName()}
	n.Path = filepath.Join("/run/netns", n.Name)
	if out, err := exec.Command("ip", "netns", "add", n.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", n.Name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", n.Name, err, out)
		}
	})
	n.IP(t, "link", "set", "lo", "up")
	return n
}

func uniqueName() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return NamePrefix + hex.EncodeToString(b)
}

// Do runs fn on an OS thread that has entered the namespace, so sockets fn
// creates belong to it. The sockets keep that namespace wherever they are
// used afterwards. fn must not start goroutines that create sockets: they
// would run on other threads, in the test's own namespace.
func (n *Netns) Do(fn func() error) error {
	// A fresh goroutine owns the thread, so the caller's goroutine never
	// runs in the namespace, and a thread that cannot be restored ends with
	// it instead of going back to the scheduler.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current namespace: %w", err)
			return
		}
		defer orig.Close()
		target, err := vnetns.GetFromPath(n.Path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open %s: %w", n.Path, err)
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", n.Name, err)
			return
		}
		fnErr := fn()
		if err := vnetns.Set(orig); err != nil {
			// Still locked: the runtime terminates this thread when the
			// goroutine returns, so no other goroutine inherits the namespace.
			errc <- errors.Join(fnErr, fmt.Errorf("leave %s: %w", n.Name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// Sysctl writes a net.* sysctl of the namespace, key in dotted form
// (ipv6.conf.default.accept_dad). /proc/sys/net shows the namespace of the
// thread that opens it, hence Do.
func (n *Netns) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	path := "/proc/sys/net/" + strings.ReplaceAll(key, ".", "/")
	if err := n.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) }); err != nil {
		t.Fatalf("sysctl net.%s=%s in %s: %v", key, value, n.Name, err)
	}
}

// Exec runs a command inside the namespace and returns its stdout.
func (n *Netns) Exec(name string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Run is Exec that fails the test on error.
func (n *Netns) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := n.Exec(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// IP runs `ip -n <ns> args...` and fails the test on error.
func (n *Netns) IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// IPBatch runs several ip commands (one per line) inside the namespace in
// one process.
func (n *Netns) IPBatch(t testing.TB, lines ...string) {
	t.Helper()
	cmd := exec.Command("ip", "-n", n.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s -batch: %v: %s\n%s", n.Name, err, out, strings.Join(lines, "\n"))
	}
}

// Nft runs the nft binary inside the namespace and fails the test on error.
func (n *Netns) Nft(t testing.TB, args ...string) string {
	t.Helper()
	return n.Run(t, "nft", args...)
}

// StartProcess starts a long-running command inside the namespace (for a
// /proc/<pid>/ns/net to point at) and returns its pid. The process is
// killed and reaped when the test ends.
func (n *Netns) StartProcess(t testing.TB, name string, args ...string) int {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	// ip netns exec execs the command in place, so the pid is the
	// command's own; a process group makes the kill reach it regardless.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s in %s: %v", name, n.Name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("process %d (%s) did not exit after SIGKILL", cmd.Process.Pid, name)
		}
	})
	// ip enters the namespace and then execs; wait until it has, so the
	// caller's /proc/<pid>/ns/net names the namespace and not ours.
	want, err := os.Stat(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
		if err == nil && os.SameFile(want, got) {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never entered %s", cmd.Process.Pid, n.Name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
