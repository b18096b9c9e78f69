package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nftredir/nftredir/client"
)

// workRoot holds the benchmark's work directories. /run is where the
// daemon keeps its state in production (tmpfs on a node).
const workRoot = "/run"

// newWorkDir creates the run's directory for daemon state, sockets and
// logs. With tmpfs it mounts one there, because the daemon's default state
// dir is on /run, which is tmpfs on a node (on this machine it may not
// be), and fsync on tmpfs costs nothing while on a disk it costs
// milliseconds.
func newWorkDir(tmpfs bool) (string, error) {
	dir, err := os.MkdirTemp(workRoot, fmt.Sprintf("%s%d-", namePrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	if tmpfs {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=256m,mode=0700"); err != nil {
			os.Remove(dir)
			return "", fmt.Errorf("mount tmpfs on %s: %w", dir, err)
		}
	}
	return dir, nil
}

func removeWorkDir(dir string) error {
	// Unmount whatever is mounted there (nothing is fine).
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

// daemon is one nftredird process under test.
type daemon struct {
	cmd      *exec.Cmd
	socket   string
	stateDir string
	logPath  string
	started  time.Time
	exited   chan struct{}
	waitErr  error
	client   *client.Client
}

// startDaemon starts nftredird on a socket and state dir under dir. The
// daemon runs as configured in production (info logs, JSON) except that
// the periodic reconcile is pushed out of the measurement window, and its
// node is nodeNetns, a namespace the benchmark made: the daemon keeps its
// probe table and pod address sets there, doing all the work it does on
// a node without touching this machine's own ruleset.
func startDaemon(bin, dir, nodeNetns string, extra ...string) (*daemon, error) {
	d := &daemon{
		socket:   filepath.Join(dir, "sock", "nftredir.sock"),
		stateDir: filepath.Join(dir, "state"),
		logPath:  filepath.Join(dir, "nftredird.log"),
		exited:   make(chan struct{}),
	}
	// No ZDS socket: no node proxy connects in the benchmark, and the
	// default path would touch /var/run/ztunnel.
	args := append([]string{
		"--socket", d.socket,
		"--state-dir", d.stateDir,
		"--reconcile-interval", "1h",
		"--node-netns", nodeNetns,
		"--probe-snat=true",
		"--zds-socket=",
		// Served, as in production, but not on the node's port.
		"--metrics-address=127.0.0.1:0",
	}, extra...)
	if err := d.launch(exec.Command(bin, args...)); err != nil {
		return nil, err
	}
	return d, nil
}

// launch starts cmd as the daemon d, its output in d.logPath, and dials
// its socket.
func (d *daemon) launch(cmd *exec.Cmd) error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	d.cmd = cmd
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// Pdeathsig: a benchmark killed with SIGKILL takes its daemon along.
	// Setpgid: a Ctrl-C in the terminal reaches the benchmark only, which
	// then stops the daemon in order.
	if d.cmd.SysProcAttr == nil {
		d.cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	d.cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	d.cmd.SysProcAttr.Setpgid = true
	d.started = time.Now()
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	d.client, err = client.Dial(context.Background(), d.socket)
	if err != nil {
		d.stop()
		return err
	}
	return nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// waitServing returns the time from process start until the daemon's
// health turned SERVING. It watches health rather than polling it, so the
// moment is not rounded up to a poll interval.
func (d *daemon) waitServing(ctx context.Context, limit time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// Wait for the listener with a plain dial: a gRPC client that fails
	// to connect backs off for up to a second, which would be measured.
	for {
		c, err := net.Dial("unix", d.socket)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-d.exited:
			return 0, fmt.Errorf("nftredird exited before listening: %v\n%s", d.waitErr, d.logTail())
		case <-ctx.Done():
			return 0, fmt.Errorf("nftredird did not listen within %v\n%s", limit, d.logTail())
		case <-time.After(500 * time.Microsecond):
		}
	}
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: client.ServiceName})
	if err != nil {
		return 0, err
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			return 0, fmt.Errorf("health watch: %w\n%s", err, d.logTail())
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return time.Since(d.started), nil
		}
	}
}

// stop ends the daemon with SIGTERM, as a node would, and SIGKILL if it
// does not stop in time.
func (d *daemon) stop() error {
	if d.client != nil {
		d.client.Close()
	}
	select {
	case <-d.exited:
		return nil
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		return errors.New("nftredird ignored SIGTERM for 15s; killed")
	}
}

func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return "nftredird log (tail):\n" + string(b)
}

// logSize is the length of the daemon's log so far: a mark for callTimes.
func (d *daemon) logSize() int64 {
	fi, err := os.Stat(d.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// callTimes reads, from the daemon's log between two marks, how long each
// call of method took inside the daemon: the logging interceptor's
// grpc.time_ms, from the first interceptor to the handler's return. The
// client's end-to-end time minus this is the client and the transport.
func (d *daemon) callTimes(from, to int64, method string) ([]time.Duration, error) {
	f, err := os.Open(d.logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []time.Duration
	sc := bufio.NewScanner(io.NewSectionReader(f, from, to-from))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["grpc.method"] != method {
			continue
		}
		var ms float64
		switch v := line["grpc.time_ms"].(type) {
		case string:
			ms, err = strconv.ParseFloat(v, 64)
		case float64:
			ms = v
		default:
			continue
		}
		if err == nil {
			out = append(out, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	return out, sc.Err()
}

// rss is VmRSS from /proc/PID/status, in bytes.
func rss(pid int) (int64, error) { return statusBytes(pid, "VmRSS:") }

// rssAnon is RssAnon, the part of VmRSS that is the process's own memory
// (heap, stacks) rather than pages of the executable, which count for as
// much of the file as the page cache holds and fault-around maps.
func rssAnon(pid int) (int64, error) { return statusBytes(pid, "RssAnon:") }

// statusBytes reads one kB field of /proc/PID/status, in bytes.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(v)
			if len(f) < 1 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", strings.TrimSuffix(field, ":"), pid)
}

func openFDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

// procCPU is user+system CPU time of a process, from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces; fields restart after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// selfAndChildrenCPU is the CPU time of this process and of its waited-for
// children: the work the exec-based baselines do happens in children.
func selfAndChildrenCPU() time.Duration {
	var self, kids unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
	tv := func(t unix.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
