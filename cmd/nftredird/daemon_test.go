package main

import (
	"bytes"
	"context"
	"fmt"
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
	"github.com/nftredir/nftredir/internal/zdstest"
)

// The daemon tests re-execute the test binary as nftredird, so the real
// main, signals and exit codes are exercised without a separate build.
const asDaemonEnv = "NFTREDIR_TEST_RUN_AS_DAEMON"

// zdsProbeEnv makes the test binary a would-be node proxy on that socket
// (run as another uid by TestDaemonZDSAllowlist).
const zdsProbeEnv = "NFTREDIR_TEST_ZDS_PROBE"

func TestMain(m *testing.M) {
	if path := os.Getenv(zdsProbeEnv); path != "" {
		fmt.Println(zdstest.Probe(path, 2*time.Second))
		os.Exit(0)
	}
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

// TestDaemonZDSAllowlist: the ZDS flags reach the server. The socket and
// the directory the daemon creates for it belong to --zds-socket-group;
// of two uids in that group only the one --zds-allow-uid names gets the
// snapshot, the other is dropped with nothing sent, and the log says so.
func TestDaemonZDSAllowlist(t *testing.T) {
	nstest.RequirePrivileged(t)
	const group, allowed, refused = 4250, 4242, 4243
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	socket, zdsSocket := filepath.Join(dir, "run", "nftredir.sock"), filepath.Join(dir, "ztunnel", "ztunnel.sock")
	d := startDaemon(t, "--socket", socket, "--state-dir", filepath.Join(dir, "pods"), "--log-format", "text", "--probe-snat=false",
		"--zds-socket", zdsSocket, "--zds-socket-group", fmt.Sprint(group), "--zds-allow-uid", fmt.Sprint(allowed))
	waitServing(t, socket)
	for p, mode := range map[string]os.FileMode{zdsSocket: 0o660, filepath.Dir(zdsSocket): 0o750} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != mode || st.Gid != group {
			t.Errorf("%s: mode %#o group %d; want %#o group %d", p, fi.Mode().Perm(), st.Gid, mode, group)
		}
	}
	bin := nstest.DialChildBinary(t)
	probe := func(uid uint32) string {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = []string{zdsProbeEnv + "=" + zdsSocket}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: group}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("probe as uid %d: %v", uid, err)
		}
		return strings.TrimSpace(string(out))
	}
	// No pods are enrolled: the snapshot is snapshot_sent alone.
	if got := probe(allowed); !strings.HasPrefix(got, "packets=1 fds=0") {
		t.Errorf("allowed uid %d got %q; want the (empty) snapshot", allowed, got)
	}
	if got := probe(refused); got != "packets=0 fds=0 closed=1" {
		t.Errorf("uid %d, in the socket group but not allowed, got %q; want the connection closed with nothing sent", refused, got)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
	if log := d.stderr.String(); !strings.Contains(log, "refused a ZDS connection") || !strings.Contains(log, fmt.Sprintf("peer_uid=%d", refused)) {
		t.Errorf("the refusal is not logged with the caller:\n%s", log)
	}
}
