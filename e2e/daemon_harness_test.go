package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// daemonStartTimeout bounds a start, including the startup reconcile.
const daemonStartTimeout = 15 * time.Second

// nftredird is one daemon under test: a process of the built binary with
// its socket, state directory and log in a directory of the test. It can be
// stopped, killed and started again on the same state, as an init system
// would.
type nftredird struct {
	bin      Binaries
	dir      string
	socket   string
	stateDir string
	log      string
	args     []string
	netns    string
	env      []string

	cmd    *exec.Cmd
	exited chan struct{}
}

// daemonOpts shape a daemon before its first start.
type daemonOpts struct {
	// dir replaces the test's temp dir as the home of socket, state and log
	// (TestDaemonAllowlist needs one that other uids can traverse).
	dir string
	// args are extra flags.
	args []string
	// netns, when set, is the network namespace the daemon runs in (a
	// test-made "node", as in the Kubernetes cluster tests); it stays in
	// the machine's mount namespace.
	netns string
	// daemon, when set, is the nftredird binary to run instead of the
	// product build (testHookDaemon).
	daemon string
	// env is more environment for the daemon.
	env []string
}

// startDaemon starts nftredird and waits until it reports SERVING. It is
// stopped, and its log printed if the test failed, when the test ends.
func startDaemon(t *testing.T, o daemonOpts) *nftredird {
	t.Helper()
	nstest.RequirePrivileged(t)
	dir := o.dir
	if dir == "" {
		dir = t.TempDir()
	}
	d := &nftredird{
		bin:      binaries(t),
		dir:      dir,
		socket:   filepath.Join(dir, "run", "nftredir.sock"),
		stateDir: filepath.Join(dir, "state"),
		log:      filepath.Join(dir, "nftredird.log"),
		args:     o.args,
		netns:    o.netns,
		env:      o.env,
	}
	if o.daemon != "" {
		d.bin.Daemon = o.daemon
	}
	// Registered first so that it runs last, after the stop below has
	// flushed the daemon's final lines.
	t.Cleanup(func() {
		if t.Failed() {
			d.dumpLog(t)
		}
	})
	t.Cleanup(func() { d.stop(t) })
	d.start(t)
	return d
}

// start runs the daemon on the existing state and waits for SERVING.
func (d *nftredird) start(t *testing.T) {
	t.Helper()
	d.launch(t)
	d.waitServing(t)
}

// launch runs the daemon on the existing state and returns at once, for a
// test that watches (or interrupts) its startup itself.
func (d *nftredird) launch(t *testing.T) {
	t.Helper()
	if d.cmd != nil {
		t.Fatalf("nftredird already running (pid %d)", d.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(d.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// Off by default here: with the daemon's defaults it would create its
	// node table in the machine's own namespace and serve ZDS under
	// /var/run/ztunnel. A test that wants them passes --node-netns and
	// --zds-socket of its own making, which win as later flags.
	args := append([]string{
		"--socket", d.socket,
		"--state-dir", d.stateDir,
		"--log-format", "json",
		"--log-level", "debug",
		"--probe-snat=false",
		"--zds-socket=",
		// Not the node's port 15014; a test that wants the endpoints
		// gives an address of its own.
		"--metrics-address=",
	}, d.args...)
	cmd := exec.Command(d.bin.Daemon, args...)
	if d.netns != "" {
		// nsenter execs the daemon in place: the pid stays the daemon's.
		cmd = exec.Command("nsenter", append([]string{"--net=" + d.netns, "--", d.bin.Daemon}, args...)...)
	}
	cmd.Env = append(cleanEnv(), d.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig: a test binary killed by its -timeout runs no cleanup; a
	// root daemon must not outlive it. The signal follows the thread that
	// forked, so that thread is held until the child exists.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatalf("start nftredird: %v", err)
	}
	d.cmd = cmd
	d.exited = make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(d.exited)
}

// waitServing polls grpc.health.v1 until both the server and the
// RedirectService are SERVING, which the daemon reports only after its
// startup reconcile.
func (d *nftredird) waitServing(t *testing.T) {
	t.Helper()
	// Not t.Context(): a test may start the daemon again from a cleanup
	// (TestCNI does), when that is already cancelled.
	c, err := client.Dial(context.Background(), d.socket, client.WithRetry(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(daemonStartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		h, err := c.Health(ctx)
		cancel()
		if err == nil && h.Serving() {
			return
		}
		select {
		case <-d.exited:
			state := d.cmd.ProcessState
			d.cmd = nil
			t.Fatalf("nftredird exited during startup (%v); see its log below", state)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nftredird not SERVING after %s (last health %+v, error %v)", daemonStartTimeout, h, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pid is the running daemon's process id.
func (d *nftredird) pid(t *testing.T) int {
	t.Helper()
	if d.cmd == nil {
		t.Fatal("nftredird is not running")
	}
	return d.cmd.Process.Pid
}

// stop ends the daemon with SIGTERM, as an init system does, and requires a
// clean exit. A daemon that ignores SIGTERM is killed and the test fails.
func (d *nftredird) stop(t *testing.T) {
	t.Helper()
	if d.cmd == nil {
		return
	}
	pid := d.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-d.exited:
		if st := d.cmd.ProcessState; !st.Success() {
			t.Errorf("nftredird (pid %d) exited with %v after SIGTERM; want a clean exit", pid, st)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("nftredird (pid %d) ignored SIGTERM for 15s; killing it", pid)
		syscall.Kill(-pid, syscall.SIGKILL)
		<-d.exited
	}
	d.cmd = nil
}

// kill ends the daemon with SIGKILL and returns once it is reaped, so that
// nothing it was doing can still happen afterwards.
func (d *nftredird) kill(t *testing.T) {
	t.Helper()
	if d.cmd == nil {
		t.Fatal("nftredird is not running")
	}
	syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

// restart stops the daemon cleanly and starts it again on the same state.
func (d *nftredird) restart(t *testing.T) {
	t.Helper()
	d.stop(t)
	d.start(t)
}

// client dials the daemon's socket; the client is closed when the test ends.
func (d *nftredird) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), d.socket, append([]client.Option{client.WithTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ctlResult is one run of nftredirctl.
type ctlResult struct {
	stdout, stderr string
	code           int
}

// ctl runs nftredirctl against the daemon, as root unless cred says
// otherwise.
func (d *nftredird) ctl(t *testing.T, cred *syscall.Credential, args ...string) ctlResult {
	t.Helper()
	cmd := exec.Command(d.bin.Ctl, append([]string{"--socket", d.socket}, args...)...)
	cmd.Env = cleanEnv()
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := ctlResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("run nftredirctl %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("nftredirctl %s -> exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// logEntries returns the daemon's JSON log lines whose message is msg.
func (d *nftredird) logEntries(t *testing.T, msg string) []map[string]any {
	t.Helper()
	f, err := os.Open(d.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["@message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// tailLog returns the last n lines of the daemon's log.
func (d *nftredird) tailLog(n int) string {
	b, err := os.ReadFile(d.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dumpLog prints the daemon's log, its tail when it is long.
func (d *nftredird) dumpLog(t *testing.T) {
	const maxLines = 400
	b, err := os.ReadFile(d.log)
	if err != nil {
		t.Logf("nftredird log %s: %v", d.log, err)
		return
	}
	lines := strings.SplitAfter(string(b), "\n")
	head := "nftredird log:\n"
	if len(lines) > maxLines {
		head = fmt.Sprintf("nftredird log (last %d of %d lines):\n", maxLines, len(lines))
		lines = lines[len(lines)-maxLines:]
	}
	t.Log(head + strings.Join(lines, ""))
}

// cleanEnv is the test's environment without NFTREDIR_* variables: the
// binaries read those as flags, and the test's own (NFTREDIR_SKIP_PRIVILEGED)
// is none of theirs.
func cleanEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "NFTREDIR_") })
}

// podState is what a namespace shows of nftredir, read with nft and ip.
type podState struct {
	table                        bool
	rule4, rule6, route4, route6 bool
}

// observePod reads the namespace's tables, ip rules and table-100 routes.
func observePod(t *testing.T, ns *nstest.Netns) podState {
	t.Helper()
	var s podState
	for l := range strings.Lines(ns.Run(t, "nft", "list", "tables")) {
		s.table = s.table || strings.TrimSpace(l) == "table inet "+nftTable
	}
	s.rule4 = isOurRule(ns.IP(t, "-4", "rule", "show"))
	// Without IPv6 in the kernel the -6 listings fail, which means none;
	// ip also fails ("FIB table does not exist") for an empty IPv4 table 100.
	r6rules, _ := ns.Exec("ip", "-6", "rule", "show")
	s.rule6 = isOurRule(r6rules)
	r4, _ := ns.Exec("ip", "-4", "route", "show", "table", "100")
	r6, _ := ns.Exec("ip", "-6", "route", "show", "table", "100")
	s.route4 = strings.Contains(r4, "local default dev lo")
	s.route6 = strings.Contains(r6, "local default dev lo")
	return s
}

// isOurRule finds the default routing's ip rule in `ip rule show` output.
func isOurRule(out string) bool {
	for l := range strings.Lines(out) {
		if strings.Contains(l, "fwmark 0x111/0xfff") && strings.Contains(l, "lookup 100") {
			return true
		}
	}
	return false
}

// enrolled: the table, and the ip rule and local route of each family.
func (s podState) enrolled() bool {
	ok := s.table && s.rule4 && s.route4
	if nstest.HaveIPv6() {
		ok = ok && s.rule6 && s.route6
	}
	return ok
}

// absent: nothing of ours at all.
func (s podState) absent() bool {
	return !s.table && !s.rule4 && !s.rule6 && !s.route4 && !s.route6
}

func (s podState) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		on   bool
	}{{"table", s.table}, {"rule4", s.rule4}, {"rule6", s.rule6}, {"route4", s.route4}, {"route6", s.route6}} {
		if f.on {
			parts = append(parts, f.name)
		} else {
			parts = append(parts, "no-"+f.name)
		}
	}
	return strings.Join(parts, " ")
}

// getPod returns the daemon's view of a pod, or nil when it is not enrolled.
func getPod(t *testing.T, c *client.Client, uid string) *nftredirv1.GetPodResponse {
	t.Helper()
	resp, err := c.GetPod(t.Context(), uid)
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("GetPod %s: %v", uid, err)
	}
	return resp
}

// wantInSync requires the daemon to report the pod in sync with its record,
// and the namespace to show the table and routing.
func wantInSync(t *testing.T, c *client.Client, uid string, ns *nstest.Netns) {
	t.Helper()
	resp := getPod(t, c, uid)
	switch {
	case resp == nil:
		t.Errorf("GetPod %s: not enrolled; want it enrolled and in sync", uid)
	case resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC:
		t.Errorf("GetPod %s: %s (%s); want IN_SYNC\n%s", uid, resp.GetSyncStatus(), resp.GetDetail(), resp.GetLiveRuleset())
	}
	if s := observePod(t, ns); !s.enrolled() {
		t.Errorf("%s shows %s; want the table and our ip rules and routes", ns.Name, s)
	}
}

// listUIDs returns the uids ListPods reports, sorted.
func listUIDs(t *testing.T, c *client.Client) []string {
	t.Helper()
	pods, err := c.ListPods(t.Context())
	if err != nil {
		t.Fatalf("ListPods: %v", err)
	}
	var uids []string
	for _, p := range pods {
		uids = append(uids, p.GetPodUid())
	}
	slices.Sort(uids)
	return uids
}
