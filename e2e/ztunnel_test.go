package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// The uids of the probe SNAT test: the kubelet (--kubelet-uid) and anyone
// else on the node.
const (
	ztKubeletUID = 4242
	ztOtherUID   = 4343
)

// nodeTable is the daemon's table in the node namespace (probe/README.md).
const nodeTable = "nftredir-node"

// nodeSetElemsRE matches the elements of one set in `nft list table`, and
// nodeElemRE one element with its comment.
var (
	nodeSetElemsRE = regexp.MustCompile(`elements = \{([^}]*)\}`)
	nodeElemRE     = regexp.MustCompile(`([0-9a-f.:]+) comment "([^"]*)"`)
)

// nodeElements reads the node table's set elements, address to owning pod
// UID, with the nft binary; ok is false when the table is absent.
func nodeElements(t *testing.T, node *nstest.Netns) (map[string]string, bool) {
	t.Helper()
	out, err := node.Exec("nft", "list", "table", "inet", nodeTable)
	if err != nil {
		return nil, false
	}
	elems := map[string]string{}
	for _, set := range nodeSetElemsRE.FindAllStringSubmatch(out, -1) {
		for _, m := range nodeElemRE.FindAllStringSubmatch(set[1], -1) {
			elems[m[1]] = m[2]
		}
	}
	return elems, true
}

func hasNodeTable(t *testing.T, ns *nstest.Netns) bool {
	t.Helper()
	for l := range strings.Lines(ns.Run(t, "nft", "list", "tables")) {
		if strings.TrimSpace(l) == "table inet "+nodeTable {
			return true
		}
	}
	return false
}

// waitUntil polls cond; reconcile passes and acks settle asynchronously.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitZDSState(t *testing.T, c *client.Client, uid, want string) {
	t.Helper()
	var last string
	waitUntil(t, fmt.Sprintf("pod %s to be %q with the node proxy", uid, want), 5*time.Second, func() bool {
		last = getPod(t, c, uid).GetPod().GetZdsState()
		return last == want
	})
}

// checkZDSAdd checks that an add carries the namespace at path and the
// pod's workload info.
func checkZDSAdd(t *testing.T, r zdstest.Request, path, name, namespace, sa string) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if dev, ino := zdstest.NetnsOf(t, r.Fds[0]); dev != st.Dev || ino != st.Ino {
		t.Errorf("add %s carries namespace %d:%d; want %s's %d:%d", r.UID, dev, ino, path, st.Dev, st.Ino)
	}
	if r.Name != name || r.Namespace != namespace || r.ServiceAccount != sa {
		t.Errorf("add %s: workload %q/%q service account %q; want %q/%q %q", r.UID, r.Namespace, r.Name, r.ServiceAccount, namespace, name, sa)
	}
}

func addPodReq(uid, name string, ns *nstest.Netns, sa string, ips ...netip.Addr) *nftredirv1.AddPodRequest {
	req := &nftredirv1.AddPodRequest{PodUid: uid, PodName: name, PodNamespace: "shop", NetnsPath: ns.Path}
	if sa != "" {
		req.ServiceAccount = &sa
	}
	for _, ip := range ips {
		req.PodIps = append(req.PodIps, ip.String())
	}
	return req
}

// TestZtunnel runs the built daemon as ztunnel's node agent: a ZDS peer
// written from the protocol description gets every enrolled pod's
// namespace fd, then adds and deletes; and the node probe table, in a
// namespace standing in for the node, lets the kubelet's connections past
// capture while everyone else's are captured.
func TestZtunnel(t *testing.T) {
	nstest.RequirePrivileged(t)
	pair := nstest.NewPair(t)
	node, podA := pair.Peer, pair.Pod
	rec := nstest.NewRecorder()
	nstest.StartProxy(t, podA, rec, nstest.DefaultProxyPorts)
	nstest.StartTCP(t, podA, rec, "app", 8080)
	// Dials as the kubelet and as another uid, for the probe SNAT.
	dialer := nstest.DialChildBinary(t)
	podB, podC := nstest.NewNetns(t), nstest.NewNetns(t)
	const uidA, uidB, uidC = "zt-pod-a", "zt-pod-b", "zt-pod-c"
	// B claims A's IPv4 address too (an IP reused before the old pod was
	// released), and one of its own.
	ownB := netip.MustParseAddr("10.99.0.3")
	ipsA := []netip.Addr{nstest.V4.Pod}
	if nstest.HaveIPv6() {
		ipsA = append(ipsA, nstest.V6.Pod)
	}

	dir := t.TempDir()
	zdsSock := filepath.Join(dir, "ztunnel", "ztunnel.sock")
	d := startDaemon(t, daemonOpts{dir: dir, args: []string{
		"--zds-socket", zdsSock,
		"--probe-snat=true",
		"--node-netns", node.Path,
		"--kubelet-uid", fmt.Sprint(ztKubeletUID),
		"--reconcile-interval", "500ms",
	}})
	c := d.client(t)
	ctx := t.Context()

	if _, err := c.AddPod(ctx, addPodReq(uidA, "web", podA, "sa-web", ipsA...)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddPod(ctx, addPodReq(uidB, "db", podB, "", nstest.V4.Pod, ownB)); err != nil {
		t.Fatal(err)
	}
	if got := getPod(t, c, uidA).GetPod().GetZdsState(); got != "no proxy connected" {
		t.Errorf("zds_state before any proxy connected: %q", got)
	}
	// The node namespace is refused like the daemon's own.
	if _, err := c.AddPod(ctx, addPodReq("zt-node", "node", node, "")); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node's own network namespace") {
		t.Errorf("AddPod of the --node-netns namespace: %v; want FailedPrecondition refusing the node's namespace", err)
	}

	peer := zdstest.Dial(t, zdsSock)
	t.Log("Snapshot")
	{
		snap := peer.Handshake()
		if len(snap) != 2 || snap[0].Kind != zdstest.Add || snap[0].UID != uidA || snap[1].Kind != zdstest.Add || snap[1].UID != uidB {
			t.Fatalf("snapshot %v; want add %s, add %s", snap, uidA, uidB)
		}
		for _, r := range snap {
			if len(r.Fds) != 1 {
				t.Fatalf("snapshot %v carries %d fds, want 1", r, len(r.Fds))
			}
		}
		checkZDSAdd(t, snap[0], podA.Path, "web", "shop", "sa-web")
		checkZDSAdd(t, snap[1], podB.Path, "db", "shop", "")
		waitZDSState(t, c, uidA, "acked")
		waitZDSState(t, c, uidB, "acked")
		if r := d.ctl(t, nil, "get", uidA); r.code != 0 || !regexp.MustCompile(`ZDS state:\s+acked`).MatchString(r.stdout) {
			t.Errorf("nftredirctl get does not show the ZDS state acked:\n%s", r.stdout)
		}
	}

	t.Log("AddAndRemove")
	{
		if _, err := c.AddPod(ctx, addPodReq(uidC, "cache", podC, "sa-cache", netip.MustParseAddr("10.99.0.4"))); err != nil {
			t.Fatal(err)
		}
		r := peer.Expect(zdstest.Add, uidC)
		checkZDSAdd(t, r, podC.Path, "cache", "shop", "sa-cache")
		peer.Ack("")
		waitZDSState(t, c, uidC, "acked")
		pods, err := c.ListPods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if p.GetZdsState() != "acked" {
				t.Errorf("ListPods: %s zds_state %q, want acked", p.GetPodUid(), p.GetZdsState())
			}
		}
		if _, err := c.RemovePod(ctx, uidC); err != nil {
			t.Fatal(err)
		}
		peer.Expect(zdstest.Del, uidC)
		peer.Ack("")
		peer.ExpectQuiet(200 * time.Millisecond)
	}

	t.Log("ProbeSNAT")
	{
		for _, a := range ipsA {
			fam := nstest.Family(a.Is6())
			to := netip.AddrPortFrom(a, 8080)
			r := node.DialAs(t, dialer, rec, ztKubeletUID, to)
			if r.Listener != "app" || r.Remote.Addr() != fam.Probe {
				t.Errorf("kubelet (uid %d) to %s: got %v; want the app, from the probe source %s", ztKubeletUID, to, r, fam.Probe)
			}
			r = node.DialAs(t, dialer, rec, ztOtherUID, to)
			if r.Listener != nstest.ProxyInbound || r.Remote.Addr() != fam.Peer {
				t.Errorf("uid %d to %s: got %v; want captured by %s from the node address %s", ztOtherUID, to, r, nstest.ProxyInbound, fam.Peer)
			}
		}
	}

	t.Log("RemoveReleasesOnlyThePodsElements")
	{
		elems, ok := nodeElements(t, node)
		if !ok || elems[nstest.V4.Pod.String()] != uidB || elems[ownB.String()] != uidB {
			t.Fatalf("node table before RemovePod %s: %v (present %v); want %s and %s owned by %s (the latest add)", uidB, elems, ok, nstest.V4.Pod, ownB, uidB)
		}
		if _, err := c.RemovePod(ctx, uidB); err != nil {
			t.Fatal(err)
		}
		peer.Expect(zdstest.Del, uidB)
		peer.Ack("")
		want := map[string]string{}
		for _, a := range ipsA {
			want[a.String()] = uidA
		}
		// RemovePod queues the node table change and replies; the batch
		// follows within moments.
		waitUntil(t, fmt.Sprintf("the node table to hand the shared address back to %s, want %v", uidA, want), 5*time.Second, func() bool {
			elems, _ = nodeElements(t, node)
			return fmt.Sprint(elems) == fmt.Sprint(want)
		})
		to := netip.AddrPortFrom(nstest.V4.Pod, 8080)
		if r := node.DialAs(t, dialer, rec, ztKubeletUID, to); r.Listener != "app" || r.Remote.Addr() != nstest.V4.Probe {
			t.Errorf("kubelet to %s after RemovePod %s: got %v; want the app from the probe source", to, uidB, r)
		}
	}

	t.Log("FlushedNodeTableRepaired")
	{
		node.Nft(t, "flush", "ruleset")
		waitUntil(t, "the node table and pod A's elements to come back", 5*time.Second, func() bool {
			elems, ok := nodeElements(t, node)
			return ok && elems[nstest.V4.Pod.String()] == uidA
		})
		to := netip.AddrPortFrom(nstest.V4.Pod, 8080)
		if r := node.DialAs(t, dialer, rec, ztKubeletUID, to); r.Listener != "app" || r.Remote.Addr() != nstest.V4.Probe {
			t.Errorf("kubelet to %s after the repair: got %v; want the app from the probe source", to, r)
		}
	}

	t.Log("StopThenUninstall")
	{
		d.stop(t)
		if _, err := peer.Recv(2 * time.Second); !errors.Is(err, zdstest.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("ZDS peer after the daemon stopped: %v; want the connection closed", err)
		}
		if _, err := os.Lstat(zdsSock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("ZDS socket left after the daemon stopped: %v", err)
		}
		if !hasNodeTable(t, node) {
			t.Fatal("a plain stop removed the node table; probes would be captured while the daemon restarts")
		}
		cmd := exec.Command(d.bin.Daemon, "uninstall", "--node-netns", node.Path, "--log-format", "text")
		cmd.Env = cleanEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nftredird uninstall: %v\n%s", err, out)
		}
		if hasNodeTable(t, node) {
			t.Error("the node table survived nftredird uninstall")
		}
		// Uninstall touches only the node table: pods stay captured.
		if s := observePod(t, podA); !s.enrolled() {
			t.Errorf("pod A after uninstall: %s; want it still captured", s)
		}
	}

	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v\n%s", err, out)
	}
	if strings.Contains(string(out), nodeTable) {
		t.Errorf("the machine's own namespace has a %s table:\n%s", nodeTable, out)
	}
}

// TestZtunnelRequireAck: with --zds-require-ack an AddPod returns only once
// the node proxy acked the pod; without a proxy a new pod is refused with
// Unavailable and its namespace left as it was, and the retry succeeds
// once a proxy has connected and acked it.
func TestZtunnelRequireAck(t *testing.T) {
	nstest.RequirePrivileged(t)
	podD, podE := nstest.NewNetns(t), nstest.NewNetns(t)
	const uidD, uidE = "zt-pod-d", "zt-pod-e"
	dir := t.TempDir()
	zdsSock := filepath.Join(dir, "ztunnel", "ztunnel.sock")
	d := startDaemon(t, daemonOpts{dir: dir, args: []string{"--zds-socket", zdsSock, "--zds-require-ack"}})
	c := d.client(t, client.WithRetry(1, 0))
	ctx := t.Context()

	_, err := c.AddPod(ctx, addPodReq(uidD, "web", podD, "sa-web"))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "was not captured") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("AddPod with no proxy connected: %v; want Unavailable saying the pod was not captured and nothing was changed", err)
	}
	if getPod(t, c, uidD) != nil {
		t.Errorf("the refused pod %s is enrolled; a refusal records nothing", uidD)
	}
	if s := observePod(t, podD); !s.absent() {
		t.Errorf("the refused pod's namespace shows %s; want nothing of ours", s)
	}

	peer := zdstest.Dial(t, zdsSock)
	if snap := peer.Handshake(); len(snap) != 0 {
		t.Fatalf("snapshot %v; want it empty: the refused pod was never captured", snap)
	}
	// The retry the error asked for: the proxy takes the pod this time.
	retried := make(chan error, 1)
	go func() {
		_, err := c.AddPod(context.WithoutCancel(ctx), addPodReq(uidD, "web", podD, "sa-web"))
		retried <- err
	}()
	add := peer.Expect(zdstest.Add, uidD)
	checkZDSAdd(t, add, podD.Path, "web", "shop", "sa-web")
	peer.Ack("")
	if err := <-retried; err != nil {
		t.Fatalf("retried AddPod once a proxy connected: %v", err)
	}
	wantInSync(t, c, uidD, podD)
	waitZDSState(t, c, uidD, "acked")

	// AddPod waits for the ack.
	type result struct {
		pod *nftredirv1.Pod
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := c.AddPod(context.WithoutCancel(ctx), addPodReq(uidE, "cache", podE, ""))
		done <- result{p, err}
	}()
	peer.Expect(zdstest.Add, uidE)
	select {
	case r := <-done:
		t.Fatalf("AddPod returned before the proxy acked: %v, %v", r.pod, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	peer.Ack("")
	r := <-done
	if r.err != nil || r.pod.GetZdsState() != "acked" {
		t.Errorf("AddPod after the ack: %v, %v; want OK and zds_state acked", r.pod, r.err)
	}
}
