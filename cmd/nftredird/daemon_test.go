package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
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

func startDaemon(t testing.TB, args ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, nil, args...)
}

// startDaemonWith starts the daemon after edit has changed its command,
// e.g. to put it in a namespace of its own.
func startDaemonWith(t testing.TB, edit func(*exec.Cmd), args ...string) *daemon {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: exec.Command(exe, args...), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), asDaemonEnv+"=1")
	d.cmd.Stderr = d.stderr
	if edit != nil {
		edit(d.cmd)
	}
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

func waitServing(t testing.TB, socket string) {
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
		"--probe-snat=false", "--zds-socket=", "--metrics-address=127.0.0.1:0"}
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

// TestDefaultStartLeavesNodeNamespaceAlone: started with the defaults, as
// on a podman host, the daemon adds no table to the namespace it runs in
// (the node's); given a kubelet uid, as in Kubernetes, it does. Each
// daemon runs in a fresh network namespace of its own, which stands for
// the node.
func TestDefaultStartLeavesNodeNamespaceAlone(t *testing.T) {
	nstest.RequirePrivileged(t)
	for _, tc := range []struct {
		extra          []string
		wantTable      bool
		wantTableAfter bool
	}{
		{nil, false, false},
		{[]string{"--kubelet-uid", "0"}, true, true},
		{[]string{"--kubelet-uid", "0", "--cleanup-on-exit"}, true, false},
	} {
		dir := t.TempDir()
		socket := filepath.Join(dir, "run", "nftredir.sock")
		// Only the paths are not the defaults: they would be the machine's.
		args := append([]string{"--socket", socket, "--state-dir", filepath.Join(dir, "pods"), "--zds-socket="}, tc.extra...)
		d := startDaemonWith(t, func(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET} }, args...)
		waitServing(t, socket)
		tables := nodeTables(t, d.cmd.Process.Pid)
		if got := strings.Contains(tables, "nftredir"); got != tc.wantTable {
			t.Errorf("%v: node namespace tables %q; want an nftredir table: %v", tc.extra, tables, tc.wantTable)
		}
		// The namespace outlives the daemon while a process holds it.
		holder := holdNetns(t, d.cmd.Process.Pid)
		d.cmd.Process.Signal(syscall.SIGTERM)
		if code := d.wait(t); code != 0 {
			t.Errorf("exit %d, log:\n%s", code, d.stderr)
		}
		tables = nodeTables(t, holder.Process.Pid)
		holder.Process.Kill()
		holder.Wait()
		if got := strings.Contains(tables, "nftredir"); got != tc.wantTableAfter {
			t.Errorf("%v: after the stop, node namespace tables %q; want an nftredir table: %v", tc.extra, tables, tc.wantTableAfter)
		}
	}
}

// holdNetns starts a process in pid's network namespace, so that the
// namespace outlives pid. Right after the daemon reports SERVING, opening
// /proc/PID/ns/net now and then fails with ENOENT for a moment (seen with
// the daemon run as this test binary; the cause is not known yet), so
// the start is retried briefly.
func holdNetns(t *testing.T, pid int) *exec.Cmd {
	t.Helper()
	path := "/proc/" + strconv.Itoa(pid) + "/ns/net"
	deadline := time.Now().Add(3 * time.Second)
	for {
		holder := exec.Command("nsenter", "--net="+path, "sleep", "60")
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		if _, err := os.Stat("/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/net"); err == nil && holder.ProcessState == nil {
			if a, b := netnsLink(path), netnsLink("/proc/"+strconv.Itoa(holder.Process.Pid)+"/ns/net"); a != "" && a == b {
				return holder
			}
		}
		holder.Process.Kill()
		holder.Wait()
		if time.Now().After(deadline) {
			t.Fatalf("cannot enter %s", path)
		}
	}
}

func netnsLink(path string) string {
	l, _ := os.Readlink(path)
	return l
}

// nodeTables lists the nftables tables of pid's network namespace.
func nodeTables(t *testing.T, pid int) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(pid)+"/ns/net", "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return string(out)
}

// TestNotifyReadyAfterReconcile runs the daemon as systemd would for
// Type=notify: READY=1 must arrive on NOTIFY_SOCKET, and only once the
// startup reconcile has repaired the recorded pods.
func TestNotifyReadyAfterReconcile(t *testing.T) {
	nstest.RequirePrivileged(t)
	pod := nstest.NewNetns(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "run", "nftredir.sock")
	args := []string{"--socket", socket, "--state-dir", filepath.Join(dir, "pods"), "--zds-socket=", "--log-format", "text"}

	d := startDaemon(t, args...)
	waitServing(t, socket)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: "notify-pod", NetnsPath: pod.Path}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(t); code != 0 {
		t.Fatalf("exit %d, log:\n%s", code, d.stderr)
	}
	// Drift while the daemon is down: only the startup reconcile puts
	// the table back.
	pod.Nft(t, "delete", "table", "inet", "nftredir")

	notify := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	d = startDaemonWith(t, func(c *exec.Cmd) { c.Env = append(c.Env, "NOTIFY_SOCKET="+notify) }, append(args, "--log-level", "debug")...)
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v; log:\n%s", err, d.stderr)
	}
	if msg := string(buf[:n]); msg != "READY=1" {
		t.Fatalf("notification %q, want READY=1", msg)
	}
	if out, err := pod.Exec("nft", "list", "table", "inet", "nftredir"); err != nil {
		t.Errorf("READY=1 sent before the startup reconcile repaired the pod: %v %s", err, out)
	}
	waitServing(t, socket)
	d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(t); code != 0 {
		t.Errorf("exit %d, log:\n%s", code, d.stderr)
	}
	// The table check above can race a fast reconcile; the daemon's own
	// log cannot: one process, one stream, in order.
	log := d.stderr.String()
	reconciled, notified := strings.Index(log, "reconcile done"), strings.Index(log, "notified systemd: READY=1")
	if reconciled < 0 || notified < 0 || notified < reconciled {
		t.Errorf("want the startup reconcile logged before READY=1; log:\n%s", log)
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
