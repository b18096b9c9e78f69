package zds_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/syncbuf"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/peercred"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/zds"
)

// The caller-check tests need connections from other uids: the test
// binary re-executes itself under that uid as a peer (runPeerChild).
const (
	peerSocketEnv = "NFTREDIR_ZDS_TEST_PEER"
	peerConnsEnv  = "NFTREDIR_ZDS_TEST_PEER_CONNS"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(peerSocketEnv); path != "" {
		os.Exit(runPeerChild(path))
	}
	os.Exit(m.Run())
}

// runPeerChild is a would-be node proxy. With one connection it says
// hello and reports everything it receives in 2s: "packets=N fds=F
// closed=C". With more it opens them all, says hello on each, prints
// "connected N", and holds them until stdin closes: a reconnect flood.
func runPeerChild(path string) int {
	n, _ := strconv.Atoi(os.Getenv(peerConnsEnv))
	if n <= 1 {
		fmt.Println(zdstest.Probe(path, 2*time.Second))
		return 0
	}
	var conns []*net.UnixConn
	for range n {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			fmt.Println("dial:", err)
			return 1
		}
		c.Write(zdstest.HelloMsg(1))
		conns = append(conns, c)
	}
	fmt.Printf("connected %d\n", len(conns))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// reachable lets other uids traverse to the fixture's socket; the socket
// directory (0750, group SocketGroup) and the socket (0660) still guard it.
func reachable(t *testing.T, f *fixture) {
	t.Helper()
	for _, p := range []string{filepath.Dir(filepath.Dir(filepath.Dir(f.path))), filepath.Dir(filepath.Dir(f.path))} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
}

func peerAs(t *testing.T, bin, path string, cred *syscall.Credential) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{peerSocketEnv + "=" + path}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("peer as uid %d: %v: %s", cred.Uid, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// TestCallerNotAllowedGetsNothing: a non-root caller that can reach the
// socket (it is in the socket's group) is dropped before anything is
// read or sent, and cannot take later pods from the real proxy.
func TestCallerNotAllowedGetsNothing(t *testing.T) {
	nstest.RequirePrivileged(t)
	bin := nstest.DialChildBinary(t)
	logs := &syncbuf.Buffer{}
	f := newFixture(t, func(c *zds.Config) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "zds", Level: hclog.Debug, Output: logs})
	})
	reachable(t, f)
	a := f.newPod("pod-a")

	// The real proxy first: it must stay the newest connection.
	proxy := zdstest.Dial(t, f.path)
	if snap := proxy.Handshake(); len(snap) != 1 || snap[0].UID != a.UID {
		t.Fatalf("proxy snapshot %v, want pod-a", snap)
	}
	intruder := &syscall.Credential{Uid: 4242, Gid: 0}
	if got := peerAs(t, bin, f.path, intruder); got != "packets=0 fds=0 closed=1" {
		t.Errorf("uid 4242 in group 0 got %q; want the connection closed with nothing sent", got)
	}
	if got := peerAs(t, bin, f.path, intruder); got != "packets=0 fds=0 closed=1" {
		t.Errorf("uid 4242 again: %q", got)
	}
	b := f.newPod("pod-b")
	f.srv.PodAdded(b)
	f.checkAdd(proxy.Expect(zdstest.Add, b.UID), b)
	proxy.Ack("")
	if st := f.srv.Stats(); st.Refused != 2 || st.Connected != 1 {
		t.Errorf("stats %+v; want 2 refused, 1 connected", st)
	}
	if n := strings.Count(logs.String(), "refused a ZDS connection"); n != 1 {
		t.Errorf("%d refusal lines for 2 refusals within the interval; want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "peer_uid=4242") {
		t.Errorf("refusal line does not name the caller:\n%s", logs)
	}
}

func TestAllowedCallers(t *testing.T) {
	nstest.RequirePrivileged(t)
	bin := nstest.DialChildBinary(t)
	for _, tc := range []struct {
		name  string
		allow peercred.Allowlist
		cred  *syscall.Credential
	}{
		{"uid", peercred.Allowlist{UIDs: []uint32{4242}}, &syscall.Credential{Uid: 4242, Gid: 0}},
		{"primary gid", peercred.Allowlist{GIDs: []uint32{4243}}, &syscall.Credential{Uid: 4242, Gid: 4243}},
		{"supplementary group", peercred.Allowlist{GIDs: []uint32{4244}}, &syscall.Credential{Uid: 4242, Gid: 0, Groups: []uint32{4244}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(c *zds.Config) { c.Allow, c.SocketGroup = tc.allow, int(tc.cred.Gid) })
			reachable(t, f)
			f.newPod("pod-a")
			// The pod's add, then snapshot_sent, then the close at the
			// end of the fixture is not waited for.
			if got := peerAs(t, bin, f.path, tc.cred); !strings.HasPrefix(got, "packets=2 fds=1 ") {
				t.Errorf("allowed caller got %q; want the snapshot (2 packets, 1 fd)", got)
			}
		})
	}
}

// TestRefusedFloodDoesNotDelayTheProxy: refused connections are dropped
// without the accept pacing, so many of them queued ahead of the real
// proxy do not keep it out.
func TestRefusedFloodDoesNotDelayTheProxy(t *testing.T) {
	nstest.RequirePrivileged(t)
	bin := nstest.DialChildBinary(t)
	logs := &syncbuf.Buffer{}
	f := newFixture(t, func(c *zds.Config) {
		c.AcceptInterval = zds.DefaultAcceptInterval
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "zds", Level: hclog.Debug, Output: logs})
	})
	reachable(t, f)
	const flood = 100
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{peerSocketEnv + "=" + f.path, peerConnsEnv + "=" + strconv.Itoa(flood)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4242, Gid: 0}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != fmt.Sprintf("connected %d", flood) {
		t.Fatalf("flood child: %q, %v", line, err)
	}
	start := time.Now()
	proxy := zdstest.Dial(t, f.path)
	proxy.Handshake()
	// 100 connections paced at 200ms would take 20s.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the proxy behind %d refused connections waited %s for its snapshot", flood, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for f.srv.Stats().Refused < flood && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if st := f.srv.Stats(); st.Refused != flood || st.Connected != 1 {
		t.Errorf("stats %+v; want %d refused and the proxy connected", st, flood)
	}
	if n := strings.Count(logs.String(), "refused a ZDS connection"); n != 1 {
		t.Errorf("%d refusal lines for %d refusals; want 1", n, flood)
	}
}
