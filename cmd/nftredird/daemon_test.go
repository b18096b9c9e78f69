package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nftredir/nftredir/internal/nstest"
)

// The daemon tests re-execute the test binary as nftredird, so the real
// main, signals and exit codes are exercised without a separate build.
const asDaemonEnv = "NFTREDIR_TEST_RUN_AS_DAEMON"

func TestMain(m *testing.M) {
	if os.Getenv(asDaemonEnv) == "1" {
		os.Args = append([]string{"nftredird"}, os.Args[1:]...)
		main()
		return
	}
	os.Exit(m.Run())
}

type daemon struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: exec.Command(exe, args...), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), asDaemonEnv+"=1")
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
	})
	return d
}

func (d *daemon) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-d.done:
		d.done <- nil
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(20 * time.Second):
		t.Fatalf("daemon did not exit; log:\n%s", d.stderr)
		return -1
	}
}

func waitServing(t *testing.T, socket string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		resp, err := healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.Status == healthgrpc.HealthCheckResponse_SERVING {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("daemon never served: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDaemonLifecycle(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "run", "nftredir.sock")
	// No node probe table and no ZDS socket: with the defaults the daemon
	// would program the machine's own namespace and serve under
	// /var/run/ztunnel.
	args := []string{"--socket", socket, "--state-dir", filepath.Join(dir, "pods"), "--socket-group", "1234", "--log-format", "text",
		"--probe-snat=false", "--zds-socket="}
	d := startDaemon(t, args...)
	waitServing(t, socket)

	fi, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != 1234 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("socket mode %#o owner %d:%d, want 0660 0:1234", fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Uid, fi.Sys().(*syscall.Stat_t).Gid)
	}
	// The daemon created the directory: it must let the socket's group in.
	if di, _ := os.Stat(filepath.Dir(socket)); di.Mode().Perm() != 0o750 || di.Sys().(*syscall.Stat_t).Gid != 1234 {
		t.Errorf("socket dir mode %#o group %d, want 0750 group 1234", di.Mode().Perm(), di.Sys().(*syscall.Stat_t).Gid)
	}

	second := startDaemon(t, args...)
	if code := second.wait(t); code != 1 || !strings.Contains(second.stderr.String(), "another nftredird is serving") {
		t.Errorf("second daemon: exit %d, log:\n%s", code, second.stderr)
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(t); code != 0 {
		t.Errorf("SIGTERM: exit %d, log:\n%s", code, d.stderr)
	}
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Error("socket left behind after exit")
	}

	// A socket file nobody serves on is stale and replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	d = startDaemon(t, args...)
	waitServing(t, socket)
	d.cmd.Process.Signal(syscall.SIGINT)
	if code := d.wait(t); code != 0 {
		t.Errorf("SIGINT: exit %d, log:\n%s", code, d.stderr)
	}
}

func TestSocketDirChecks(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	if _, err := listenSocket(filepath.Join(open, "s.sock"), 0); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("world-writable dir: %v", err)
	}
	foreign := filepath.Join(dir, "foreign")
	os.Mkdir(foreign, 0o750)
	os.Chown(foreign, 1000, 1000)
	if _, err := listenSocket(filepath.Join(foreign, "s.sock"), 0); err == nil || !strings.Contains(err.Error(), "owned by uid 1000") {
		t.Errorf("foreign dir: %v", err)
	}
	own := filepath.Join(dir, "own")
	os.Mkdir(own, 0o750)
	notSock := filepath.Join(own, "s.sock")
	os.WriteFile(notSock, nil, 0o600)
	if _, err := listenSocket(notSock, 0); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file at the socket path: %v", err)
	}
	if _, err := os.Stat(notSock); err != nil {
		t.Error("the regular file was removed")
	}
	link := filepath.Join(dir, "link")
	os.Symlink(own, link)
	if _, err := listenSocket(filepath.Join(link, "x.sock"), 0); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("symlinked dir: %v", err)
	}
}
