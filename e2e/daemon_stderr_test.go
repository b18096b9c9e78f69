package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// startWithStderr runs the built daemon with stderr the write end of a
// pipe the test holds the read end of, as under a log shim or journald's
// stream, and waits for SERVING (reading nothing from the pipe).
func startWithStderr(t *testing.T) (*exec.Cmd, *os.File, *client.Client, chan struct{}) {
	t.Helper()
	nstest.RequirePrivileged(t)
	bin := binaries(t)
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "run", "nftredir.sock")
	cmd := exec.Command(bin.Daemon, "--socket", socket, "--state-dir", filepath.Join(dir, "state"),
		"--log-format", "json", "--log-level", "debug", "--probe-snat=false", "--zds-socket=")
	cmd.Env = cleanEnv()
	cmd.Stderr = w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		r.Close()
	})
	c, err := client.Dial(context.Background(), socket, client.WithRetry(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), daemonStartTimeout)
	defer cancel()
	for {
		if h, err := c.Health(ctx); err == nil && h.Serving() {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("daemon never served")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd, r, c, exited
}

// requests makes n calls that each log a line, failing the test on the
// first that does not answer in time.
func requests(t *testing.T, c *client.Client, exited chan struct{}, n int) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ListPods(ctx)
		cancel()
		if err != nil {
			select {
			case <-exited:
				t.Fatalf("request %d: the daemon died: %v", i+1, err)
			case <-time.After(time.Second):
				t.Fatalf("request %d: %v", i+1, err)
			}
		}
	}
}

// TestDaemonSurvivesLostLogReader: the log reader goes away (a log shim
// or journald restarting). The daemon must keep serving, not die of
// SIGPIPE on its next log line.
func TestDaemonSurvivesLostLogReader(t *testing.T) {
	cmd, r, c, exited := startWithStderr(t)
	r.Close()
	requests(t, c, exited, 50)
	select {
	case <-exited:
		t.Fatalf("the daemon exited: %v", cmd.ProcessState)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestDaemonSurvivesStalledLogReader: a reader that stops reading fills
// the pipe; logging must not block the daemon's requests.
func TestDaemonSurvivesStalledLogReader(t *testing.T) {
	_, _, c, exited := startWithStderr(t)
	// Each request logs a few hundred bytes at debug; a pipe holds 64 KiB.
	start := time.Now()
	requests(t, c, exited, 2000)
	t.Logf("2000 requests with a stalled log reader: %s", time.Since(start))
}
