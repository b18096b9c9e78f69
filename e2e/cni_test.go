package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// These tests run the plugin the way a container runtime does, through
// the reference tools: cnitool (libcni) executes bridge, host-local and
// nftredir-cni, which talks to a real nftredird.
//
// Nothing touches the machine's own network namespace: cnitool runs in a
// test-made "node" namespace, so the bridge lives there, and the daemon is
// told to protect that namespace as it protects its own. cnitool also runs
// in a private mount namespace whose /var/lib is a test directory, because
// libcni keeps its result cache in /var/lib/cni and offers no setting for it.

// Each network on the bridge has its own 40 addresses, starting here.
const (
	cniPodIP0     = 10
	cniPlainIP0   = 50
	cniDropInIP0  = 90
	cniInsertIP0  = 130
	cniInstallIP0 = 170
	cniV031IP0    = 210
	cniAppPort    = 8080
	cniNodePort   = 9090
	cniApp        = "app"
	cniNodeSrv    = "node-server"
	cniTableName  = "nftredir"
)

// cniWorld is one node: binaries, a node namespace, a daemon, and
// networks sharing one bridge: "<net>" ending in nftredir-cni, "<net>-plain"
// without it (to compare results with), and those the drop-in and
// insertion tests chain the plugin into.
type cniWorld struct {
	dir       string
	cniPath   string // CNI_PATH: bridge, host-local, loopback, nftredir-cni
	plugin    string // the nftredir-cni binary
	cnitool   string
	node      *nstest.Netns
	net       string
	bridge    string
	subnet    netip.Prefix
	gateway   netip.Addr
	daemon    *nftredird
	socket    string // the daemon's
	dataDir   string // nftredir-cni attachment records
	pluginLog string
	netconf   string // NETCONFPATH
	varLib    string // /var/lib as cnitool sees it
	client    *client.Client
}

func TestCNI(t *testing.T) {
	nstest.RequirePrivileged(t)
	w := newCNIWorld(t)
	t.Run("AddCheckDel", w.testAddCheckDel)
	t.Run("DelAfterNetnsGone", w.testDelAfterNetnsGone)
	t.Run("AddWithoutDaemon", w.testAddWithoutDaemon)
	t.Run("Status", w.testStatus)
	t.Run("GC", w.testGC)
	t.Run("Version", w.testVersion)
	t.Run("DropIn", w.testDropIn)
	t.Run("InsertIntoConflist", w.testInsert)
	t.Run("InstallStep", w.testInstallStep)
	t.Run("Version031", w.testVersion031)
}

func newCNIWorld(t *testing.T) *cniWorld {
	t.Helper()
	bins := binaries(t)
	w := &cniWorld{dir: t.TempDir()}
	// On failure, the plugin's log is printed too (startDaemon prints the
	// daemon's).
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(w.pluginLog); err == nil {
				t.Logf("%s:\n%s", w.pluginLog, b)
			}
		}
	})
	w.cniPath = filepath.Join(w.dir, "cni-bin")
	if err := os.MkdirAll(w.cniPath, 0o755); err != nil {
		t.Fatal(err)
	}
	w.cnitool = filepath.Join(bins.Repo, "bin", "cnitool")
	for _, tool := range []string{"cnitool", "bridge", "host-local", "loopback"} {
		p := filepath.Join(bins.Repo, "bin", tool)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing: %v; run hack/deps.sh (make deps) to install the reference CNI tools", p, err)
		}
		if tool != "cnitool" {
			if err := os.Symlink(p, filepath.Join(w.cniPath, tool)); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.plugin = bins.CNI
	if err := os.Symlink(w.plugin, filepath.Join(w.cniPath, "nftredir-cni")); err != nil {
		t.Fatal(err)
	}

	w.node = nstest.NewNetns(t)
	suffix := cniRandHex(4)
	w.net = "nftr-cni-" + suffix
	w.bridge = "nftrb" + suffix
	r := cniRandBytes(2)
	w.subnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + r[0]%100, r[1], 0}), 24)
	w.gateway = w.subnet.Addr().Next()
	w.dataDir = filepath.Join(w.dir, "cni-data")
	w.pluginLog = filepath.Join(w.dir, "nftredir-cni.log")
	w.netconf = filepath.Join(w.dir, "net.d")
	w.varLib = filepath.Join(w.dir, "var-lib")
	for _, d := range []string{w.netconf, filepath.Join(w.varLib, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// nftredird runs in the machine's namespace (it only ever enters pod
	// namespaces, by fd), told to protect the node namespace as its own.
	w.daemon = startDaemon(t, daemonOpts{dir: w.dir, args: []string{
		"--protect-netns", w.node.Path,
		// Never the machine's own ruleset, nor /var/run/ztunnel.
		"--probe-snat=false",
		"--zds-socket=",
		// cnitool deletes no namespace after DEL, as runtimes do; the
		// daemon then removes the capture itself once this has passed.
		"--teardown-grace", cniTeardownGrace.String(),
	}})
	w.socket = w.daemon.socket
	w.client = w.daemon.client(t)

	w.writeConflist(t, w.net, cniPodIP0, w.pluginConf(nil))
	w.writeConflist(t, w.net+"-plain", cniPlainIP0)
	return w
}

// cniTeardownGrace is the daemon's --teardown-grace in these tests.
const cniTeardownGrace = time.Second

func cniRandBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func cniRandHex(n int) string { return hex.EncodeToString(cniRandBytes(n)) }

// writeConflist writes a network: bridge with host-local handing out
// addresses from ip0 on, then more plugins.
func (w *cniWorld) writeConflist(t *testing.T, name string, ip0 byte, more ...any) string {
	t.Helper()
	return w.writeConflistAt(t, "1.1.0", name, ip0, more...)
}

// writeConflistAt is writeConflist declaring cniVersion version.
func (w *cniWorld) writeConflistAt(t *testing.T, version, name string, ip0 byte, more ...any) string {
	t.Helper()
	base := w.subnet.Addr().As4()
	start, end := base, base
	start[3], end[3] = ip0, ip0+39
	plugins := []any{map[string]any{
		"type":      "bridge",
		"bridge":    w.bridge,
		"isGateway": true,
		// No masquerade: bridge would program iptables for it, and these
		// tests program nothing they do not need.
		"ipMasq": false,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": filepath.Join(w.dir, "ipam"),
			"ranges": [][]map[string]string{{{
				"subnet":     w.subnet.String(),
				"rangeStart": netip.AddrFrom4(start).String(),
				"rangeEnd":   netip.AddrFrom4(end).String(),
				"gateway":    w.gateway.String(),
			}}},
			"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
		},
	}}
	plugins = append(plugins, more...)
	b, err := json.MarshalIndent(map[string]any{"cniVersion": version, "name": name, "plugins": plugins}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(w.netconf, name+".conflist")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// pluginConf is nftredir-cni's entry in the conflist, plus extra keys.
func (w *cniWorld) pluginConf(extra map[string]any) map[string]any {
	c := map[string]any{
		"type":     "nftredir-cni",
		"socket":   w.socket,
		"timeout":  "5s",
		"dataDir":  w.dataDir,
		"logFile":  w.pluginLog,
		"logLevel": "debug",
	}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// ensureDaemon starts the daemon again if a test stopped it.
func (w *cniWorld) ensureDaemon(t *testing.T) {
	t.Helper()
	if w.daemon.cmd == nil {
		w.daemon.start(t)
	}
}

// cniPod is a pod sandbox: a namespace the test made, deleted when the
// test ends unless the test deleted it first.
type cniPod struct {
	*nstest.Netns
	uid string
	// cniArgs are what a Kubernetes runtime passes.
	cniArgs string
}

func (w *cniWorld) newPod(t *testing.T) *cniPod {
	t.Helper()
	name := "nftr-c-" + cniRandHex(4)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	p := &cniPod{Netns: &nstest.Netns{Name: name, Path: "/run/netns/" + name}, uid: "uid-" + cniRandHex(8)}
	p.cniArgs = fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=%s;K8S_POD_UID=%s", name, p.uid)
	t.Cleanup(func() {
		if _, err := os.Stat(p.Path); err == nil {
			if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", name, err, out)
			}
		}
	})
	// Whatever a test did or failed to do, the runtime's DEL leaves no
	// record behind to confuse the next test; it is idempotent, and
	// harmless for a pod never added.
	t.Cleanup(func() {
		if out, errOut, err := w.runCnitool("del", w.net, p); err != nil {
			t.Errorf("cleanup: cnitool del %s: %v\n%s%s", p.Path, err, out, errOut)
		}
	})
	p.IP(t, "link", "set", "lo", "up")
	return p
}

// containerID is the id cnitool derives from the namespace path.
func (p *cniPod) containerID() string {
	s := sha512.Sum512([]byte(p.Path))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// runCnitool runs cnitool in the node namespace with a private /var/lib.
func (w *cniWorld) runCnitool(cmd, network string, p *cniPod) (stdout, stderr string, err error) {
	script := `mount --bind "$0" /var/lib && exec "$@"`
	c := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
		w.varLib, "ip", "netns", "exec", w.node.Name, w.cnitool, cmd, network, p.Path)
	c.Env = append(os.Environ(), "CNI_PATH="+w.cniPath, "NETCONFPATH="+w.netconf, "CNI_ARGS="+p.cniArgs)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err = c.Run()
	return out.String(), errb.String(), err
}

func (w *cniWorld) mustCnitool(t *testing.T, cmd, network string, p *cniPod) string {
	t.Helper()
	out, errOut, err := w.runCnitool(cmd, network, p)
	if err != nil {
		t.Fatalf("cnitool %s %s %s: %v\nstdout: %s\nstderr: %s", cmd, network, p.Path, err, out, errOut)
	}
	return out
}

// execPlugin runs nftredir-cni directly, as libcni would, with conf on
// stdin; it returns stdout and the exit error.
func (w *cniWorld) execPlugin(t *testing.T, command string, conf map[string]any, env ...string) (string, error) {
	t.Helper()
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(w.plugin)
	c.Env = append([]string{"CNI_COMMAND=" + command, "CNI_PATH=" + w.cniPath}, env...)
	c.Stdin = bytes.NewReader(b)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err = c.Run()
	if errb.Len() > 0 {
		t.Logf("nftredir-cni %s stderr: %s", command, errb.String())
	}
	return out.String(), err
}

// directConf is the plugin's config as libcni hands it over.
func (w *cniWorld) directConf(extra map[string]any) map[string]any {
	c := w.pluginConf(extra)
	c["cniVersion"] = "1.1.0"
	c["name"] = w.net
	return c
}

func cniError(t *testing.T, stdout string) types.Error {
	t.Helper()
	var e types.Error
	if err := json.Unmarshal([]byte(stdout), &e); err != nil || e.Msg == "" {
		t.Fatalf("stdout is not a CNI error (%v): %q", err, stdout)
	}
	return e
}

func hasTable(t *testing.T, p *cniPod) bool {
	t.Helper()
	out := p.Run(t, "nft", "list", "tables")
	return strings.Contains(out, "table inet "+cniTableName)
}

// parseResult reads a printed 1.1.0 result.
func parseResult(t *testing.T, s string) *current.Result {
	t.Helper()
	var r current.Result
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		t.Fatalf("result is not a CNI result: %v\n%s", err, s)
	}
	return &r
}

// podAddr is the address bridge gave the pod's eth0.
func podAddr(t *testing.T, r *current.Result) netip.Addr {
	t.Helper()
	for _, ip := range r.IPs {
		if ip.Interface != nil && r.Interfaces[*ip.Interface].Sandbox != "" {
			a, _ := netip.AddrFromSlice(ip.Address.IP.To4())
			return a
		}
	}
	t.Fatalf("no sandbox address in result %+v", r)
	return netip.Addr{}
}

// normalise masks what differs between two pods of one bridge, so a
// result with nftredir-cni can be compared with one without it.
func normalise(t *testing.T, s string) any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	for _, i := range v["interfaces"].([]any) {
		m := i.(map[string]any)
		if m["name"] != nil && strings.HasPrefix(m["name"].(string), "veth") {
			m["name"] = "veth*"
			m["mac"] = "*"
		}
		if m["sandbox"] != nil {
			m["sandbox"] = "*"
			m["mac"] = "*"
		}
	}
	for _, i := range v["ips"].([]any) {
		m := i.(map[string]any)
		m["address"] = "*"
	}
	return v
}

func (w *cniWorld) testAddCheckDel(t *testing.T) {
	w.ensureDaemon(t)
	p := w.newPod(t)
	rec := nstest.NewRecorder()
	nstest.StartProxy(t, p.Netns, rec, nstest.DefaultProxyPorts)

	out := w.mustCnitool(t, "add", w.net, p)
	res := parseResult(t, out)
	addr := podAddr(t, res)
	if !w.subnet.Contains(addr) {
		t.Fatalf("pod address %s outside %s", addr, w.subnet)
	}
	nstest.StartTCP(t, p.Netns, rec, cniApp, cniAppPort)
	nstest.StartTCP(t, w.node, rec, cniNodeSrv, cniNodePort)

	// The result is bridge's, unchanged: the same as a network without
	// nftredir-cni prints for another pod on the same bridge, up to what
	// differs between pods, and true to the kernel.
	plainPod := w.newPod(t)
	plain := w.mustCnitool(t, "add", w.net+"-plain", plainPod)
	t.Cleanup(func() { w.runCnitool("del", w.net+"-plain", plainPod) })
	if diff := cmp.Diff(normalise(t, plain), normalise(t, out)); diff != "" {
		t.Errorf("result with nftredir-cni differs from bridge's own (-bridge +ours):\n%s", diff)
	}
	if res.CNIVersion != "1.1.0" {
		t.Errorf("result cniVersion %q", res.CNIVersion)
	}
	if got := p.IP(t, "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, addr.String()+"/24") {
		t.Errorf("eth0 in the pod lacks %s: %s", addr, got)
	}

	// Enrolled, in sync, under the pod UID, with the pod's address.
	got := getPod(t, w.client, p.uid)
	if got == nil {
		t.Fatalf("pod %s not enrolled after cnitool add; enrolled: %v", p.uid, listUIDs(t, w.client))
	}
	if got.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("sync status %s: %s", got.GetSyncStatus(), got.GetDetail())
	}
	if pod := got.GetPod(); pod.GetNetnsPath() != p.Path || !slices.Equal(pod.GetPodIps(), []string{addr.String()}) ||
		pod.GetPodNamespace() != "e2e" || pod.GetPodName() != p.Name {
		t.Errorf("record %v; want netns %s, ips [%s], e2e/%s", pod, p.Path, addr, p.Name)
	}

	// Real traffic is captured: inbound from the node lands on the proxy's
	// transparent listener with the original destination as its local
	// address; the pod's outbound lands on the outbound listener.
	w.expectCaptured(t, p, rec, addr)

	w.mustCnitool(t, "check", w.net, p)

	// Tampering is seen by CHECK...
	p.Run(t, "nft", "delete", "table", "inet", cniTableName)
	if out, errOut, err := w.runCnitool("check", w.net, p); err == nil {
		t.Errorf("cnitool check passed with the pod's table deleted\n%s%s", out, errOut)
	} else if !strings.Contains(errOut, "absent") {
		t.Errorf("cnitool check failed without saying the rules are absent: %s", errOut)
	}
	// ...and repaired by the daemon's reconcile, here the one at start.
	w.daemon.restart(t)
	w.mustCnitool(t, "check", w.net, p)
	w.expectCaptured(t, p, rec, addr)

	for i := range 2 {
		if out, errOut, err := w.runCnitool("del", w.net, p); err != nil {
			t.Fatalf("cnitool del #%d: %v\n%s%s", i+1, err, out, errOut)
		}
	}
	if uids := listUIDs(t, w.client); len(uids) != 0 {
		t.Errorf("records after cnitool del: %v", uids)
	}
	if files, _ := filepath.Glob(filepath.Join(w.dataDir, w.net, "*")); len(files) != 0 {
		t.Errorf("attachment records after cnitool del: %v", files)
	}
	w.waitCaptureGone(t, p)
}

func (w *cniWorld) expectCaptured(t *testing.T, p *cniPod, rec *nstest.Recorder, addr netip.Addr) {
	t.Helper()
	to := netip.AddrPortFrom(addr, cniAppPort)
	r, err := w.node.Exchange(rec, nstest.Dial{Network: "tcp4", To: to})
	if err != nil {
		t.Errorf("node -> pod %s: %v", to, err)
	} else if r.Listener != nstest.ProxyInbound || r.Local != to {
		t.Errorf("node -> pod %s answered by %s; want %s with local address %s", to, r, nstest.ProxyInbound, to)
	}
	srv := netip.AddrPortFrom(w.gateway, cniNodePort)
	r, err = p.Exchange(rec, nstest.Dial{Network: "tcp4", To: srv})
	if err != nil {
		t.Errorf("pod -> node %s: %v", srv, err)
	} else if r.Listener != nstest.ProxyOutbound || r.OrigDst != srv {
		t.Errorf("pod -> node %s answered by %s; want %s with original destination %s", srv, r, nstest.ProxyOutbound, srv)
	}
}

func (w *cniWorld) testDelAfterNetnsGone(t *testing.T) {
	w.ensureDaemon(t)
	p := w.newPod(t)
	w.mustCnitool(t, "add", w.net, p)
	if getPod(t, w.client, p.uid) == nil {
		t.Fatal("not enrolled")
	}
	if out, err := exec.Command("ip", "netns", "del", p.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	for i := range 2 {
		if out, errOut, err := w.runCnitool("del", w.net, p); err != nil {
			t.Fatalf("cnitool del #%d with the namespace gone: %v\n%s%s", i+1, err, out, errOut)
		}
	}
	if getPod(t, w.client, p.uid) != nil {
		t.Error("record survived DEL")
	}
}

func (w *cniWorld) testAddWithoutDaemon(t *testing.T) {
	w.ensureDaemon(t)
	p := w.newPod(t)
	w.daemon.stop(t)
	t.Cleanup(func() { w.ensureDaemon(t) })

	out, errOut, err := w.runCnitool("add", w.net, p)
	if err == nil {
		t.Fatalf("cnitool add succeeded with the daemon stopped:\n%s", out)
	}
	if !strings.Contains(errOut, w.socket) {
		t.Errorf("cnitool add error does not name the socket: %s", errOut)
	}
	if strings.Contains(out, `"ips"`) {
		t.Errorf("a result was printed for a failed ADD:\n%s", out)
	}
	// The plugin's own answer, as the runtime parses it: a CNI error with
	// code 11, try again later.
	prev := `{"cniVersion":"1.1.0","ips":[{"address":"` + w.gateway.Next().String() + `/24"}]}`
	stdout, err := w.execPlugin(t, "ADD", w.directConf(map[string]any{"prevResult": json.RawMessage(prev)}),
		"CNI_CONTAINERID=direct-"+p.Name, "CNI_NETNS="+p.Path, "CNI_IFNAME=eth0", "CNI_ARGS="+p.cniArgs)
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("plugin ADD without daemon: %v, want a non-zero exit", err)
	}
	if e := cniError(t, stdout); e.Code != 11 || !strings.Contains(e.Msg, w.socket) {
		t.Errorf("plugin ADD without daemon printed code %d %q; want code 11 naming %s", e.Code, e.Msg, w.socket)
	}

	// Nothing was programmed anywhere.
	if hasTable(t, p) {
		t.Error("the pod got a table although ADD failed")
	}
	if files, _ := filepath.Glob(filepath.Join(w.dataDir, w.net, "*")); len(files) != 0 {
		t.Errorf("attachment records after failed ADDs: %v", files)
	}
	w.daemon.start(t)
	if getPod(t, w.client, p.uid) != nil {
		t.Error("the daemon has a record of the pod whose ADD failed")
	}
	// The runtime deletes what the failed ADD left (bridge's veth, the
	// address); that succeeds too.
	w.mustCnitool(t, "del", w.net, p)
}

func (w *cniWorld) testStatus(t *testing.T) {
	w.ensureDaemon(t)
	p := w.newPod(t) // cnitool wants a namespace argument, though STATUS has none
	w.mustCnitool(t, "status", w.net, p)
	if stdout, err := w.execPlugin(t, "STATUS", w.directConf(nil)); err != nil {
		t.Fatalf("plugin STATUS with the daemon serving: %v %s", err, stdout)
	}

	w.daemon.stop(t)
	t.Cleanup(func() { w.ensureDaemon(t) })
	if out, errOut, err := w.runCnitool("status", w.net, p); err == nil {
		t.Errorf("cnitool status passed with the daemon stopped: %s%s", out, errOut)
	}
	stdout, err := w.execPlugin(t, "STATUS", w.directConf(nil))
	if err == nil {
		t.Fatal("plugin STATUS passed with the daemon stopped")
	}
	if e := cniError(t, stdout); e.Code != 50 || !strings.Contains(e.Msg, w.socket) {
		t.Errorf("STATUS printed code %d %q; want 50 naming the socket", e.Code, e.Msg)
	}
	w.daemon.start(t)
	w.mustCnitool(t, "status", w.net, p)
}

func (w *cniWorld) testGC(t *testing.T) {
	w.ensureDaemon(t)
	keep, stale := w.newPod(t), w.newPod(t)
	for _, p := range []*cniPod{keep, stale} {
		w.mustCnitool(t, "add", w.net, p)
	}
	// A pod enrolled by someone else (a node proxy, an operator) is not
	// the plugin's to collect, whatever the runtime's list says.
	foreign := w.newPod(t)
	foreignUID := "foreign-" + cniRandHex(4)
	if _, err := w.client.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: foreignUID, NetnsPath: foreign.Path}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.client.RemovePod(context.Background(), foreignUID) })

	valid := []types.GCAttachment{{ContainerID: keep.containerID(), IfName: "eth0"}}
	stdout, err := w.execPlugin(t, "GC", w.directConf(map[string]any{"cni.dev/valid-attachments": valid}))
	if err != nil {
		t.Fatalf("plugin GC: %v %s", err, stdout)
	}
	want := []string{foreignUID, keep.uid}
	slices.Sort(want)
	if diff := cmp.Diff(want, listUIDs(t, w.client)); diff != "" {
		t.Errorf("enrolled after GC (-want +got):\n%s", diff)
	}
	if hasTable(t, stale) {
		t.Error("GC left the stale pod's table")
	}
	if !hasTable(t, keep) || !hasTable(t, foreign) {
		t.Error("GC removed a live pod's table")
	}
	w.mustCnitool(t, "check", w.net, keep)

	// The older key name works as well.
	stdout, err = w.execPlugin(t, "GC", w.directConf(map[string]any{"cni.dev/attachments": []types.GCAttachment{}}))
	if err != nil {
		t.Fatalf("plugin GC: %v %s", err, stdout)
	}
	if diff := cmp.Diff([]string{foreignUID}, listUIDs(t, w.client)); diff != "" {
		t.Errorf("enrolled after GC with nothing valid (-want +got):\n%s", diff)
	}
}

func (w *cniWorld) testVersion(t *testing.T) {
	stdout, err := w.execPlugin(t, "VERSION", map[string]any{"cniVersion": "1.1.0"})
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}, v.Supported); diff != "" {
		t.Errorf("supported versions (-want +got):\n%s", diff)
	}
}

// exampleDropIn is deploy/cni/99-nftredir.conf, the file docs/cni.md
// installs, with this world's socket and paths in place of the node's.
func (w *cniWorld) exampleDropIn(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "cni", "99-nftredir.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("deploy/cni/99-nftredir.conf: %v", err)
	}
	for k, v := range w.pluginConf(nil) {
		if k == "socket" || k == "dataDir" || k == "logFile" {
			c[k] = v
		}
	}
	b, err = json.MarshalIndent(c, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(w.dir, "99-nftredir.conf")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// testDropIn chains the plugin into a network without editing its
// conflist: libcni >= 1.3 (cnitool v1.3.0 is) appends <network>/*.conf.
func (w *cniWorld) testDropIn(t *testing.T) {
	w.ensureDaemon(t)
	network := w.net + "-dropin"
	w.writeConflist(t, network, cniDropInIP0)
	dir := filepath.Join(w.netconf, network)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(w.exampleDropIn(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "99-nftredir.conf"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	w.addCheckDel(t, network)
}

// testInsert runs the conflist insertion of docs/cni.md, twice (it must
// not add the plugin again), and uses the result.
func (w *cniWorld) testInsert(t *testing.T) {
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("jq is not installed; docs/cni.md's insertion command needs it")
	}
	w.ensureDaemon(t)
	network := w.net + "-insert"
	conflist := w.writeConflist(t, network, cniInsertIP0)
	plugin := w.exampleDropIn(t)
	// The command of docs/cni.md, with this world's plugin entry.
	script := `jq --slurpfile p ` + plugin + ` \
  "if any(.plugins[]; .type == \"nftredir-cni\") then . else .plugins += \$p end" \
  "$0" > "$0.tmp" && mv "$0.tmp" "$0"`
	for range 2 {
		if out, err := exec.Command("sh", "-c", script, conflist).CombinedOutput(); err != nil {
			t.Fatalf("insertion: %v: %s", err, out)
		}
	}
	b, err := os.ReadFile(conflist)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"nftredir-cni"`); n != 1 {
		t.Fatalf("the plugin is in the conflist %d times after inserting twice:\n%s", n, b)
	}
	w.addCheckDel(t, network)
}

// addCheckDel runs a pod through a network that chains the plugin.
func (w *cniWorld) addCheckDel(t *testing.T, network string) {
	t.Helper()
	p := w.newPod(t)
	t.Cleanup(func() { w.runCnitool("del", network, p) })
	w.mustCnitool(t, "add", network, p)
	got := getPod(t, w.client, p.uid)
	if got == nil || got.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Fatalf("after cnitool add on %s: record %v", network, got)
	}
	if !hasTable(t, p) {
		t.Error("no table in the pod")
	}
	w.mustCnitool(t, "check", network, p)
	w.mustCnitool(t, "del", network, p)
	if getPod(t, w.client, p.uid) != nil {
		t.Error("pod still enrolled after cnitool del")
	}
	w.waitCaptureGone(t, p)
}

// waitCaptureGone waits for the capture of a pod DEL released to leave
// its namespace. DEL tells the daemon the runtime deletes the namespace
// next, and the capture may be left to go with it; cnitool deletes no
// namespace, so the daemon must remove the capture itself once its
// teardown grace has passed.
func (w *cniWorld) waitCaptureGone(t *testing.T, p *cniPod) {
	t.Helper()
	for deadline := time.Now().Add(cniTeardownGrace + 10*time.Second); ; time.Sleep(100 * time.Millisecond) {
		table, rules := hasTable(t, p), p.IP(t, "rule", "show")
		if !table && !strings.Contains(rules, "fwmark") {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s after cnitool del of a namespace that survived: table left %v, ip rules:\n%s", cniTeardownGrace+10*time.Second, table, rules)
			return
		}
	}
}

// testInstallStep runs "nftredir-cni install" as docs/cni.md does, into a
// configuration and a bin directory of its own, then runs a pod through
// the network it chained, using the binary it copied; uninstall then
// takes both away and a pod is no longer enrolled.
func (w *cniWorld) testInstallStep(t *testing.T) {
	w.ensureDaemon(t)
	confDir := filepath.Join(w.dir, "net.d-install")
	binDir := filepath.Join(w.dir, "cni-bin-install")
	for _, d := range []string{confDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		target, err := os.Readlink(filepath.Join(w.cniPath, p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(binDir, p)); err != nil {
			t.Fatal(err)
		}
	}
	// cnitool uses this world's directories for the rest of the subtest.
	savedPath, savedConf := w.cniPath, w.netconf
	w.cniPath, w.netconf = binDir, confDir
	defer func() { w.cniPath, w.netconf = savedPath, savedConf }()
	network := w.net + "-install"
	conflist := w.writeConflist(t, network, cniInstallIP0)
	entry, err := json.Marshal(map[string]any{"dataDir": w.dataDir, "logLevel": "debug"})
	if err != nil {
		t.Fatal(err)
	}
	entryFile := filepath.Join(w.dir, "install-entry.json")
	if err := os.WriteFile(entryFile, entry, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--plugin-config", entryFile,
		"--socket", w.socket, "--timeout", "5s", "--log-file", w.pluginLog}
	run := func(sub string, extra ...string) (int, string) {
		out, err := exec.Command(w.plugin, append(append([]string{sub}, args...), extra...)...).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := run("install", "--once"); code != 0 {
		t.Fatalf("install --once: exit %d\n%s", code, out)
	}
	first, _ := os.ReadFile(conflist)
	if code, out := run("install", "--once"); code != 0 {
		t.Fatalf("install --once again: exit %d\n%s", code, out)
	}
	if again, _ := os.ReadFile(conflist); string(again) != string(first) {
		t.Errorf("a second install changed the network:\n%s\n%s", first, again)
	}
	if code, out := run("install", "--check"); code != 0 {
		t.Errorf("install --check: exit %d\n%s", code, out)
	}
	for _, name := range []string{"nftredir-cni", "nftredir-cni-helper"} {
		if fi, err := os.Lstat(filepath.Join(binDir, name)); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s was not copied into the bin dir: %v", name, err)
		}
	}
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(first, &l); err != nil {
		t.Fatal(err)
	}
	if n := len(l.Plugins); n != 2 || l.Plugins[1]["type"] != "nftredir-cni" || l.Plugins[1]["cniVersion"] != nil {
		t.Fatalf("network after install:\n%s", first)
	}
	w.addCheckDel(t, network)

	if code, out := run("uninstall"); code != 0 {
		t.Fatalf("uninstall: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(conflist); strings.Contains(string(b), "nftredir-cni") {
		t.Errorf("the plugin is still chained after uninstall:\n%s", b)
	}
	for _, name := range []string{"nftredir-cni", "nftredir-cni-helper"} {
		if _, err := os.Lstat(filepath.Join(binDir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after uninstall: %v", name, err)
		}
	}
	p := w.newPod(t)
	t.Cleanup(func() { w.runCnitool("del", network, p) })
	w.mustCnitool(t, "add", network, p)
	if getPod(t, w.client, p.uid) != nil || hasTable(t, p) {
		t.Error("a pod was enrolled through the network after uninstall")
	}
	w.mustCnitool(t, "del", network, p)
}

// testVersion031 runs a pod through a cniVersion 0.3.1 network (the
// version of Flannel's, Calico's, Cilium's and kindnet's defaults) that
// "nftredir-cni install" chained the plugin into: bridge's 0.3.1 result
// comes back unchanged, the pod is enrolled with its address and its
// traffic captured, CHECK is refused as 0.3.1 has none, DEL releases it.
func (w *cniWorld) testVersion031(t *testing.T) {
	w.ensureDaemon(t)
	network := w.net + "-v031"
	conflist := w.writeConflistAt(t, "0.3.1", network, cniV031IP0)
	entry, err := json.Marshal(map[string]any{"dataDir": w.dataDir, "logLevel": "debug"})
	if err != nil {
		t.Fatal(err)
	}
	entryFile := filepath.Join(w.dir, "v031-entry.json")
	binDir := filepath.Join(w.dir, "cni-bin-v031")
	if err := os.WriteFile(entryFile, entry, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(w.plugin, "install", "--once", "--cni-bin-dir", binDir, "--cni-conf-dir", w.netconf,
		"--cni-conf-name", filepath.Base(conflist), "--plugin-config", entryFile,
		"--socket", w.socket, "--timeout", "5s", "--log-file", w.pluginLog).CombinedOutput()
	if err != nil {
		t.Fatalf("install --once into a 0.3.1 network: %v\n%s", err, out)
	}
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Plugins    []map[string]any `json:"plugins"`
	}
	b, _ := os.ReadFile(conflist)
	if err := json.Unmarshal(b, &l); err != nil || l.CNIVersion != "0.3.1" || len(l.Plugins) != 2 || l.Plugins[1]["type"] != "nftredir-cni" {
		t.Fatalf("network after install (%v):\n%s", err, b)
	}

	p := w.newPod(t)
	t.Cleanup(func() { w.runCnitool("del", network, p) })
	rec := nstest.NewRecorder()
	nstest.StartProxy(t, p.Netns, rec, nstest.DefaultProxyPorts)
	res := w.mustCnitool(t, "add", network, p)
	var r struct {
		CNIVersion string `json:"cniVersion"`
		IPs        []struct {
			Version string `json:"version"`
		} `json:"ips"`
	}
	if err := json.Unmarshal([]byte(res), &r); err != nil || r.CNIVersion != "0.3.1" || len(r.IPs) == 0 || r.IPs[0].Version != "4" {
		t.Errorf("result is not bridge's 0.3.1 result (%v):\n%s", err, res)
	}
	addr := podAddr(t, parseResult(t, res))
	got := getPod(t, w.client, p.uid)
	if got == nil || got.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Fatalf("after cnitool add on the 0.3.1 network: record %v", got)
	}
	if ips := got.GetPod().GetPodIps(); !slices.Equal(ips, []string{addr.String()}) {
		t.Errorf("enrolled with %v, want [%s]", ips, addr)
	}
	nstest.StartTCP(t, p.Netns, rec, cniApp, cniAppPort)
	nstest.StartTCP(t, w.node, rec, cniNodeSrv, cniNodePort)
	w.expectCaptured(t, p, rec, addr)

	// libcni refuses CHECK on a 0.3.1 network; the plugin, asked
	// directly, answers with the spec's incompatible-version code.
	if out, errOut, err := w.runCnitool("check", network, p); err == nil {
		t.Errorf("cnitool check of a 0.3.1 network passed: %s%s", out, errOut)
	}
	conf := w.pluginConf(map[string]any{"cniVersion": "0.3.1", "name": network, "dataDir": w.dataDir,
		"prevResult": json.RawMessage(res)})
	stdout, err := w.execPlugin(t, "CHECK", conf, "CNI_CONTAINERID="+p.containerID(), "CNI_NETNS="+p.Path,
		"CNI_IFNAME=eth0", "CNI_ARGS="+p.cniArgs)
	if err == nil {
		t.Errorf("plugin CHECK at 0.3.1 succeeded: %s", stdout)
	} else if e := cniError(t, stdout); e.Code != types.ErrIncompatibleCNIVersion {
		t.Errorf("plugin CHECK at 0.3.1: code %d %q, want %d", e.Code, e.Msg, types.ErrIncompatibleCNIVersion)
	}

	w.mustCnitool(t, "del", network, p)
	if getPod(t, w.client, p.uid) != nil {
		t.Error("pod still enrolled after cnitool del on the 0.3.1 network")
	}
	w.waitCaptureGone(t, p)
}
