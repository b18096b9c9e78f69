package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// These tests run the built nftredird and nftredirctl (see binaries) the
// way an operator would: the daemon as a process with its socket and state
// in a test directory, callers over the socket. Every namespace they
// program is test-made; the machine's own namespace is only read.

// expectTCP checks, for each address family, that peer -> pod:appPort
// lands on the proxy's inbound listener with the original destination
// recoverable, and that pod -> peer:serverPort lands on the outbound
// listener; or, with captured false, that both reach their real listeners.
func expectTCP(t *testing.T, p *pod, mode nft.Mode, captured bool) {
	t.Helper()
	for _, v6 := range []bool{false, true} {
		if v6 && !nstest.HaveIPv6() {
			continue
		}
		a, network := nstest.V4, "tcp4"
		if v6 {
			a, network = nstest.V6, "tcp6"
		}
		in := netip.AddrPortFrom(a.Pod, appPort)
		out := netip.AddrPortFrom(a.Peer, serverPort)
		if !captured {
			p.expect(t, p.Peer, nstest.Dial{Network: network, To: in}, app)
			p.expect(t, p.Pod, nstest.Dial{Network: network, To: out}, server)
			continue
		}
		r := p.expect(t, p.Peer, nstest.Dial{Network: network, To: in}, nstest.ProxyInbound)
		wantInbound(t, mode, r, in)
		r = p.expect(t, p.Pod, nstest.Dial{Network: network, To: out}, nstest.ProxyOutbound)
		if r.Listener == nstest.ProxyOutbound && r.OrigDst != out {
			t.Errorf("outbound capture: SO_ORIGINAL_DST %v; want %s", r.OrigDst, out)
		}
	}
}

// TestDaemonEnrolCapture enrols a pod with nftredirctl through the
// daemon's socket, observes capture with real TCP in both families, removes
// it, and requires the pod's networking to be exactly as before.
func TestDaemonEnrolCapture(t *testing.T) {
	nstest.RequirePrivileged(t)
	d := startDaemon(t, daemonOpts{})
	c := d.client(t)
	for _, mode := range []nft.Mode{nft.ModeTProxy, nft.ModeRedirect} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPod(t, variant{mode: mode})
			uid := "e2e-enrol-" + strings.ToLower(mode.String())
			before := observe(t, p)
			expectTCP(t, p, mode, false)

			r := d.ctl(t, nil, "add", "--pod-uid", uid, "--name", "web", "--namespace", "e2e",
				"--netns", p.Pod.Path, "--ip", nstest.V4.Pod.String(), "--ip", nstest.V6.Pod.String(),
				"--mode", strings.ToLower(mode.String()))
			if r.code != 0 || !strings.Contains(r.stdout, "Enrolled") {
				t.Fatalf("nftredirctl add: exit %d; want 0 and an \"Enrolled\" line", r.code)
			}
			wantInSync(t, c, uid, p.Pod)
			if got := getPod(t, c, uid); got != nil {
				if m := got.GetPod().GetOptions().GetCaptureMode().String(); !strings.HasSuffix(m, mode.String()) {
					t.Errorf("recorded capture mode %s; want %s", m, mode)
				}
				if ips := got.GetPod().GetPodIps(); len(ips) != 2 {
					t.Errorf("recorded pod IPs %v; want both addresses given", ips)
				}
			}
			expectTCP(t, p, mode, true)
			wantCounted(t, d, uid, mode)

			r = d.ctl(t, nil, "remove", uid)
			if r.code != 0 || !strings.Contains(r.stdout, "Removed") {
				t.Fatalf("nftredirctl remove: exit %d; want 0 and a \"Removed\" line", r.code)
			}
			if getPod(t, c, uid) != nil {
				t.Errorf("GetPod %s after RemovePod: still enrolled", uid)
			}
			if s := observePod(t, p.Pod); !s.absent() {
				t.Errorf("after RemovePod %s shows %s; want nothing of ours", p.Pod.Name, s)
			}
			if diff := before.diff(observe(t, p)); diff != "" {
				t.Errorf("pod state after RemovePod differs from before AddPod (-before +after):\n%s", diff)
			}
			expectTCP(t, p, mode, false)
		})
	}
	if uids := listUIDs(t, c); len(uids) != 0 {
		t.Errorf("ListPods after every pod was removed: %v", uids)
	}
}

// wantCounted requires `nftredirctl get` to show the pod in sync with
// the capture rules' counters moved by expectTCP's connections: counters
// are per rule, and their counts are not drift.
func wantCounted(t *testing.T, d *nftredird, uid string, mode nft.Mode) {
	t.Helper()
	r := d.ctl(t, nil, "get", uid)
	if r.code != 0 || !regexp.MustCompile(`Sync status:\s+in sync`).MatchString(r.stdout) {
		t.Fatalf("nftredirctl get: exit %d; want 0 and in sync\n%s", r.code, r.stdout)
	}
	inbound := fmt.Sprintf(`tproxy ip to 127\.0\.0\.1:%d`, defaults.InboundPort)
	if mode == nft.ModeRedirect {
		inbound = fmt.Sprintf(`redirect to :%d`, defaults.InboundPort)
	}
	for _, rule := range []string{inbound, fmt.Sprintf(`redirect to :%d`, defaults.OutboundPort)} {
		re := regexp.MustCompile(`(?m)^\s+meta l4proto tcp .*counter packets [1-9][0-9]* bytes [1-9][0-9]* ` + rule + ` `)
		if !re.MatchString(r.stdout) {
			t.Errorf("nftredirctl get does not show the rule %q counting the connections:\n%s", rule, r.stdout)
		}
	}
}

// tamperCase damages an enrolled pod in one way. probe is a connection the
// damage breaks (it reaches broken, or nobody when broken is "") and the
// repair restores (it reaches repaired).
type tamperCase struct {
	name             string
	tamper           func(t *testing.T, p *pod)
	status           nftredirv1.SyncStatus
	from             func(p *pod) *nstest.Netns
	probe            nstest.Dial
	broken, repaired string
	// live, if set, is a line GetPod's live_ruleset must show after the
	// damage: the kernel's rule, not the one recorded.
	live *regexp.Regexp
}

var tamperCases = []tamperCase{
	{
		name:     "table deleted",
		tamper:   func(t *testing.T, p *pod) { p.Pod.Nft(t, "delete", "table", "inet", nftTable) },
		status:   nftredirv1.SyncStatus_SYNC_STATUS_ABSENT,
		from:     func(p *pod) *nstest.Netns { return p.Peer },
		probe:    nstest.Dial{Network: "tcp4", To: netip.AddrPortFrom(nstest.V4.Pod, appPort)},
		broken:   app,
		repaired: nstest.ProxyInbound,
	},
	{
		// The last rules of mangle-prerouting are the catch-all tproxy to
		// the inbound port (one per family) and the fail-closed drop
		// behind them; without them inbound reaches the app directly.
		name: "rules deleted",
		tamper: func(t *testing.T, p *pod) {
			hs := ruleHandles(t, p, "mangle-prerouting")
			for _, h := range hs[len(hs)-3:] {
				p.Pod.Nft(t, "delete", "rule", "inet", nftTable, "mangle-prerouting", "handle", h)
			}
		},
		status:   nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED,
		from:     func(p *pod) *nstest.Netns { return p.Peer },
		probe:    nstest.Dial{Network: "tcp4", To: netip.AddrPortFrom(nstest.V4.Pod, appPort)},
		broken:   app,
		repaired: nstest.ProxyInbound,
	},
	{
		name:     "chain flushed",
		tamper:   func(t *testing.T, p *pod) { p.Pod.Nft(t, "flush", "chain", "inet", nftTable, "nat-output") },
		status:   nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED,
		from:     func(p *pod) *nstest.Netns { return p.Pod },
		probe:    nstest.Dial{Network: "tcp4", To: netip.AddrPortFrom(nstest.V4.Peer, serverPort)},
		broken:   server,
		repaired: nstest.ProxyOutbound,
	},
	{
		// Same place, same comment, no redirect: only the expressions
		// show it.
		name: "capture rule edited in place",
		tamper: func(t *testing.T, p *pod) {
			editInPlace(t, p, "nat-output", fmt.Sprintf("redirect to :%d", defaults.OutboundPort))
		},
		status:   nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED,
		from:     func(p *pod) *nstest.Netns { return p.Pod },
		probe:    nstest.Dial{Network: "tcp4", To: netip.AddrPortFrom(nstest.V4.Peer, serverPort)},
		broken:   server,
		repaired: nstest.ProxyOutbound,
		live:     regexp.MustCompile(`(?m)^\t\tmeta l4proto tcp accept comment "nftredir pod=[^"]*"$`),
	},
	{
		// Without the fwmark rule a tproxied packet for an address the pod
		// does not own is routed away instead of delivered.
		name: "ip rule deleted",
		tamper: func(t *testing.T, p *pod) {
			p.Pod.IP(t, "-4", "rule", "del", "fwmark", "0x111/0xfff", "lookup", "100")
		},
		status:   nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED,
		from:     func(p *pod) *nstest.Netns { return p.Peer },
		probe:    nstest.Dial{Network: "tcp4", To: netip.AddrPortFrom(nstest.V4.Routed, appPort), Timeout: 500 * time.Millisecond},
		broken:   "",
		repaired: nstest.ProxyInbound,
	},
}

// tampered is one enrolled pod of a tamper case.
type tampered struct {
	tamperCase
	p       *pod
	uid     string
	listing string // the table before the damage
}

// enrolAndTamper enrols one pod per case through the daemon and damages it.
func enrolAndTamper(t *testing.T, d *nftredird, prefix string) []*tampered {
	t.Helper()
	c := d.client(t)
	var ps []*tampered
	for i, tc := range tamperCases {
		x := &tampered{tamperCase: tc, p: newPod(t, variant{mode: nft.ModeTProxy}), uid: fmt.Sprintf("%s-%d", prefix, i)}
		if _, err := c.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: x.uid, NetnsPath: x.p.Pod.Path}); err != nil {
			t.Fatalf("AddPod %s: %v", x.uid, err)
		}
		x.listing = listTable(t, x.p)
		x.p.expect(t, tc.from(x.p), tc.probe, tc.repaired)
		tc.tamper(t, x.p)
		ps = append(ps, x)
	}
	return ps
}

// wantRepaired requires the pod back in sync, with its original table and
// working capture.
func (x *tampered) wantRepaired(t *testing.T, d *nftredird) {
	t.Helper()
	wantInSync(t, d.client(t), x.uid, x.p.Pod)
	if diff := cmp.Diff(x.listing, listTable(t, x.p)); diff != "" {
		t.Errorf("%s: table after repair differs from the one enrolled (-enrolled +now):\n%s", x.name, diff)
	}
	x.p.expect(t, x.from(x.p), x.probe, x.repaired)
	x.p.expect(t, x.p.Peer, x.p.to(x.p.a.Pod, appPort), nstest.ProxyInbound)
	x.p.expect(t, x.p.Pod, x.p.to(x.p.a.Peer, serverPort), nstest.ProxyOutbound)
}

// TestDaemonRepair damages enrolled pods with nft and ip and requires the
// daemon to put them back: at its next start, and, without a restart, at
// its periodic reconcile.
func TestDaemonRepair(t *testing.T) {
	nstest.RequirePrivileged(t)
	t.Run("Restart", func(t *testing.T) {
		// The default 30s interval: only the startup reconcile can repair
		// within this test.
		d := startDaemon(t, daemonOpts{})
		c := d.client(t)
		ps := enrolAndTamper(t, d, "e2e-restart")
		for _, x := range ps {
			if x.broken == "" {
				x.p.expectFail(t, x.from(x.p), x.probe)
			} else {
				x.p.expect(t, x.from(x.p), x.probe, x.broken)
			}
			got := getPod(t, c, x.uid)
			if got == nil || got.GetSyncStatus() != x.status {
				t.Errorf("%s: GetPod after the damage reports %v; want %s", x.name, got.GetSyncStatus(), x.status)
			}
			if x.live != nil && !x.live.MatchString(got.GetLiveRuleset()) {
				t.Errorf("%s: GetPod's live_ruleset does not show the kernel's rule (%s):\n%s", x.name, x.live, got.GetLiveRuleset())
			}
		}
		d.restart(t)
		done := d.logEntries(t, "reconcile done")
		if len(done) == 0 {
			t.Fatal(`no "reconcile done" line in the daemon's log`)
		}
		if last := done[len(done)-1]; last["repaired"] != float64(len(ps)) {
			t.Errorf("startup reconcile: %v; want repaired=%d", last, len(ps))
		}
		for _, x := range ps {
			x.wantRepaired(t, d)
		}
	})
	t.Run("Periodic", func(t *testing.T) {
		d := startDaemon(t, daemonOpts{args: []string{"--reconcile-interval", "500ms"}})
		c := d.client(t)
		start := time.Now()
		ps := enrolAndTamper(t, d, "e2e-periodic")
		deadline := time.Now().Add(5 * time.Second)
		for _, x := range ps {
			for {
				got := getPod(t, c, x.uid)
				if got != nil && got.GetSyncStatus() == nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s still %v %s after %s with --reconcile-interval 500ms", x.name, x.uid, got.GetSyncStatus(), got.GetDetail(), time.Since(start).Round(time.Millisecond))
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		t.Logf("all %d pods repaired %s after the first AddPod", len(ps), time.Since(start).Round(time.Millisecond))
		// The repair must be the reconcile's doing, not a lucky no-op.
		repaired := map[string]bool{}
		for _, e := range d.logEntries(t, "repairing") {
			repaired[fmt.Sprint(e["pod"])] = true
		}
		for _, x := range ps {
			if !repaired[x.uid] {
				t.Errorf("%s: no \"repairing\" log line for %s", x.name, x.uid)
			}
			x.wantRepaired(t, d)
		}
	})
}

// hostState is what the test's own namespace, the machine's, shows of
// netfilter and policy routing. It is only ever read.
type hostState struct {
	Ruleset, Rules4, Rules6, Table100v4, Table100v6 string
}

func readHost(t *testing.T) hostState {
	t.Helper()
	run := func(mustWork bool, name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil && mustWork {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// -s: counters and quotas of other people's rules move on their own.
	return hostState{
		Ruleset: run(true, "nft", "-s", "list", "ruleset"),
		Rules4:  run(true, "ip", "-4", "rule", "show"),
		Rules6:  run(false, "ip", "-6", "rule", "show"),
		// An empty table 100 is an error ("FIB table does not exist"),
		// whose text is as good a fingerprint as any listing.
		Table100v4: run(false, "ip", "-4", "route", "show", "table", "100"),
		Table100v6: run(false, "ip", "-6", "route", "show", "table", "100"),
	}
}

// TestDaemonHostilePaths offers the daemon paths that are not a pod's
// network namespace. Each must be refused with the right code and a
// message naming the problem, and nothing may change anywhere.
func TestDaemonHostilePaths(t *testing.T) {
	nstest.RequirePrivileged(t)
	d := startDaemon(t, daemonOpts{})
	c := d.client(t)
	dir := t.TempDir()
	pid := d.pid(t)
	daemonNet := fmt.Sprintf("/proc/%d/ns/net", pid)

	// PID 1's namespace is the node's, unless a sandbox forbids even root
	// to open it; then the refusal says so instead.
	pid1Msg := "node's own network namespace"
	if _, err := os.Stat("/proc/1/ns/net"); err != nil {
		t.Logf("this machine hides /proc/1/ns/net from root (%v); expecting \"not accessible\" for it", err)
		pid1Msg = "not accessible"
	}
	mk := func(name string, f func(string) error) string {
		p := filepath.Join(dir, name)
		if err := f(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	regular := mk("regular", func(p string) error { return os.WriteFile(p, []byte("not a namespace\n"), 0o644) })
	directory := mk("directory", func(p string) error { return os.Mkdir(p, 0o755) })
	fifo := mk("fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) })
	sock := mk("socket", func(p string) error {
		l, err := net.Listen("unix", p)
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	link := func(name, target string) string {
		return mk(name, func(p string) error { return os.Symlink(target, p) })
	}
	loop := filepath.Join(dir, "loop")
	link("loop", loop)
	// The host namespace bind-mounted at an innocent-looking path, as
	// `ip netns attach` would put it under /run/netns: what a caller who
	// can mount could offer. Not under /run/netns itself, so that a leftover
	// after a crashed run is no host namespace with a test's name.
	bound := mk("bound-netns", func(p string) error { return os.WriteFile(p, nil, 0o600) })
	if err := unix.Mount(fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), bound, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount the host namespace at %s: %v", bound, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bound, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", bound, err)
		}
	})

	const inval, precond = codes.InvalidArgument, codes.FailedPrecondition
	cases := []struct {
		name, path string
		code       codes.Code
		msg        string
	}{
		{"PID 1's netns", "/proc/1/ns/net", precond, pid1Msg},
		{"/proc/self/ns/net (the daemon's own)", "/proc/self/ns/net", precond, "node's own network namespace"},
		{"the daemon's netns by pid", daemonNet, precond, "node's own network namespace"},
		{"the test's netns by pid", fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), precond, "node's own network namespace"},
		{"the host netns bind-mounted", bound, precond, "node's own network namespace"},
		{"symlink to PID 1's netns", link("link-pid1", "/proc/1/ns/net"), precond, pid1Msg},
		{"symlink to /proc/self/ns/net", link("link-self", "/proc/self/ns/net"), precond, "node's own network namespace"},
		{"symlink to the daemon's netns", link("link-daemon", daemonNet), precond, "node's own network namespace"},
		{"symlink loop", loop, precond, "not a network namespace"},
		{"dangling symlink", link("dangling", filepath.Join(dir, "nothing")), precond, "does not exist"},
		{"regular file", regular, precond, "not a namespace file"},
		{"directory", directory, precond, "not a namespace file"},
		{"FIFO", fifo, precond, "not a namespace file"},
		{"character device", "/dev/null", precond, "not a namespace file"},
		{"Unix socket", sock, precond, "not a network namespace"},
		{"the daemon's own socket", d.socket, precond, "not a network namespace"},
		{"mount namespace", "/proc/self/ns/mnt", precond, "namespace of another kind"},
		{"UTS namespace", "/proc/self/ns/uts", precond, "namespace of another kind"},
		{"missing path", filepath.Join(dir, "missing"), precond, "does not exist"},
		{"path through a file", filepath.Join(regular, "net"), precond, "does not exist"},
		{"empty path", "", inval, "netns_path is required"},
		{"relative path", "run/netns/pod", inval, "is relative"},
		{"unclean path", bound + "/../bound-netns", inval, "not in clean form"},
	}

	before := readHost(t)
	for i, tc := range cases {
		uid := fmt.Sprintf("e2e-hostile-%d", i)
		_, err := c.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: uid, NetnsPath: tc.path})
		st := status.Convert(err)
		switch {
		case err == nil:
			t.Errorf("%s (%q): AddPod succeeded; want %s", tc.name, tc.path, tc.code)
		case st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg):
			t.Errorf("%s (%q): %s: %s\nwant %s with a message containing %q", tc.name, tc.path, st.Code(), st.Message(), tc.code, tc.msg)
		default:
			t.Logf("%s (%q): %s: %s", tc.name, tc.path, st.Code(), st.Message())
		}
	}

	// The CLI reports a refusal as the code and the daemon's message.
	r := d.ctl(t, nil, "add", "--pod-uid", "e2e-hostile-ctl", "--netns", "/proc/self/ns/net")
	if r.code != 1 || !strings.Contains(r.stderr, "FailedPrecondition") || !strings.Contains(r.stderr, "node's own network namespace") {
		t.Errorf("nftredirctl add of the host namespace: exit %d, stderr %q; want exit 1 naming FailedPrecondition and the host namespace", r.code, r.stderr)
	}

	if uids := listUIDs(t, c); len(uids) != 0 {
		t.Errorf("ListPods after refused requests: %v; want none", uids)
	}
	if entries, err := os.ReadDir(d.stateDir); err != nil {
		t.Error(err)
	} else if len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("state dir after refused requests holds %v; want it empty", names)
	}
	after := readHost(t)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("the machine's own namespace changed (-before +after):\n%s", diff)
	}
	if isOurRule(after.Rules4) || isOurRule(after.Rules6) {
		t.Errorf("the machine's own namespace has an ip rule of ours:\n%s%s", after.Rules4, after.Rules6)
	}
	// The FIFO and the socket must not have wedged the daemon.
	if h, err := c.Health(t.Context()); err != nil || !h.Serving() {
		t.Errorf("daemon health after the hostile paths: %+v, %v", h, err)
	}
}

// TestDaemonAllowlist calls the daemon as unprivileged uids: one that may
// reach the socket but is not allowed, one that may not reach it, and the
// allowed one.
func TestDaemonAllowlist(t *testing.T) {
	nstest.RequirePrivileged(t)
	const (
		allowedUID = 4242
		otherUID   = 65534 // nobody
		sockGID    = 4243
	)
	// The test's usual temp dirs are 0700; callers of other uids must be
	// able to traverse to the socket, which stays guarded by its directory
	// (0750, group sockGID) and its own mode. The socket's directory is
	// left for the daemon to create, as it does after every boot.
	dir, err := os.MkdirTemp("", "nftredir-e2e-allow-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemonOpts{dir: dir, args: []string{"--allow-uid", fmt.Sprint(allowedUID), "--socket-group", fmt.Sprint(sockGID)}})
	for p, mode := range map[string]os.FileMode{d.socket: 0o660, filepath.Dir(d.socket): 0o750} {
		if fi, err := os.Stat(p); err != nil {
			t.Fatal(err)
		} else if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != mode || st.Gid != sockGID || st.Uid != 0 {
			t.Errorf("%s: mode %v owner %d:%d; want %v and 0:%d", p, fi.Mode().Perm(), st.Uid, st.Gid, mode, sockGID)
		}
	}
	c := d.client(t)
	ns := nstest.NewNetns(t)

	denied := &syscall.Credential{Uid: otherUID, Gid: sockGID}
	for _, args := range [][]string{
		{"add", "--pod-uid", "e2e-denied", "--netns", ns.Path},
		{"remove", "e2e-denied"},
		{"list"},
	} {
		r := d.ctl(t, denied, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "PermissionDenied") || !strings.Contains(r.stderr, fmt.Sprintf("uid %d", otherUID)) {
			t.Errorf("nftredirctl %s as uid %d: exit %d, stderr %q; want exit 1, PermissionDenied naming the uid", args[0], otherUID, r.code, r.stderr)
		}
	}
	// Health is open to anyone who can reach the socket, for probes.
	if r := d.ctl(t, denied, "health"); r.code != 0 {
		t.Errorf("nftredirctl health as uid %d: exit %d; want 0 (health needs no allowlist entry)", otherUID, r.code)
	}
	// Outside the socket's group the socket itself is closed.
	if r := d.ctl(t, &syscall.Credential{Uid: otherUID, Gid: otherUID}, "list"); r.code != 1 || !strings.Contains(r.stderr, "permission denied") {
		t.Errorf("nftredirctl list as uid %d outside group %d: exit %d, stderr %q; want exit 1 and permission denied on the socket", otherUID, sockGID, r.code, r.stderr)
	}
	if uids := listUIDs(t, c); len(uids) != 0 {
		t.Errorf("ListPods after refused calls: %v; want none", uids)
	}
	if s := observePod(t, ns); !s.absent() {
		t.Errorf("after refused calls %s shows %s; want nothing of ours", ns.Name, s)
	}
	refused := 0
	for _, e := range d.logEntries(t, "finished call") {
		if e["grpc.code"] == "PermissionDenied" && e["peer.uid"] == float64(otherUID) {
			refused++
		}
	}
	if refused != 3 {
		t.Errorf("daemon logged %d PermissionDenied calls from uid %d; want 3", refused, otherUID)
	}

	allowed := &syscall.Credential{Uid: allowedUID, Gid: sockGID}
	if r := d.ctl(t, allowed, "add", "--pod-uid", "e2e-allowed", "--netns", ns.Path); r.code != 0 {
		t.Fatalf("nftredirctl add as allowed uid %d: exit %d", allowedUID, r.code)
	}
	wantInSync(t, c, "e2e-allowed", ns)
	if r := d.ctl(t, allowed, "remove", "e2e-allowed"); r.code != 0 {
		t.Errorf("nftredirctl remove as allowed uid %d: exit %d", allowedUID, r.code)
	}
	if s := observePod(t, ns); !s.absent() {
		t.Errorf("after remove %s shows %s; want nothing of ours", ns.Name, s)
	}
}
