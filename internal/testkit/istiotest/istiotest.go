// Package istiotest runs stock Istio on a kcluster for tests: istiod
// (pilot-discovery, built at a pinned version by hack/istio-tools.sh) and
// ztunnel (a stock binary named by ZTUNNEL_BIN), each as a host process in
// the cluster's node network namespace, as the tools README of the project's
// CI describes. Nothing of Istio is faked: istiod issues the identities,
// ztunnel speaks HBONE and enforces policy; nftredird is ztunnel's node
// agent over ZDS. See README.md.
package istiotest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nftredir/nftredir/internal/testkit/kcluster"
)

// Version is the istio.io/istio module version hack/istio-tools.sh builds
// (a test checks they agree).
const Version = "v0.0.0-20260827124520-eed52ebb66ad"

// Environment variables that locate the binaries.
const (
	// BinEnv overrides the directory of pilot-discovery and
	// crd-all.gen.yaml.
	BinEnv = "NFTREDIR_ISTIO_BIN"
	// ZtunnelEnv names a stock ztunnel binary. ztunnel is not a Go module,
	// so nothing here builds it.
	ZtunnelEnv = "ZTUNNEL_BIN"
)

// Fixed names and ports, all in the cluster's own node namespace.
const (
	SystemNamespace = "istio-system"
	// ZtunnelSA is the account istiod trusts to request certificates for
	// the pods of its node (CA_TRUSTED_NODE_ACCOUNTS).
	ZtunnelSA = "ztunnel"
	// RootCertConfigMap is what istiod publishes into each namespace once
	// its CA is up.
	RootCertConfigMap = "istio-ca-root-cert"
	// IstiodHostname is the name in istiod's self-signed serving
	// certificate.
	IstiodHostname = "istiod.istio-system.svc"
	ClusterID      = "Kubernetes"
	TrustDomain    = "cluster.local"

	xdsPort = 15012
	// istiod's monitoring port moves off 15014, nftredird's metrics port
	// on a real node.
	istiodMonitoring = "127.0.0.1:15114"
	ztunnelAdmin     = "127.0.0.1:15000"
	ztunnelReady     = 15021
	// placeholderPort is where the hostNetwork placeholder pod's standin
	// listens: away from istiod's 8080, 15010, 15012, 15017 and ztunnel's
	// ports.
	placeholderPort = 15999

	upTimeout = 2 * time.Minute
)

// BinDir is where hack/istio-tools.sh leaves pilot-discovery and the CRDs:
// $NFTREDIR_ISTIO_BIN, else
// ${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/istio-<version>/bin.
func BinDir() string {
	if d := os.Getenv(BinEnv); d != "" {
		return d
	}
	base := os.Getenv("NFTREDIR_TOOLS_CACHE")
	if base == "" {
		base = "/var/cache/nftredir"
	}
	return filepath.Join(base, "istio-"+Version, "bin")
}

// Binaries are the stock Istio programs a test runs.
type Binaries struct {
	Istiod  string // pilot-discovery
	CRDs    string // crd-all.gen.yaml
	Ztunnel string
}

// Require returns the binaries, or skips the test saying how to provide
// them when ZTUNNEL_BIN is unset; a ZTUNNEL_BIN that is set but wrong, or a
// missing istiod build, fails it (CI would otherwise pass without ever
// running the suite).
func Require(t testing.TB) Binaries {
	t.Helper()
	zt := os.Getenv(ZtunnelEnv)
	if zt == "" {
		t.Skipf("Istio suite skipped: %s is unset. Run it with %s=/path/to/ztunnel (a stock ztunnel built from istio/ztunnel; CI's .ci/run sets it from ../shared/tools/ztunnel) after make deps-istio, e.g. %s=... make e2e-istio", ZtunnelEnv, ZtunnelEnv, ZtunnelEnv)
	}
	dir := BinDir()
	b := Binaries{Istiod: filepath.Join(dir, "pilot-discovery"), CRDs: filepath.Join(dir, "crd-all.gen.yaml"), Ztunnel: zt}
	for _, f := range []string{b.Ztunnel, b.Istiod, b.CRDs} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("Istio suite: %v; run hack/istio-tools.sh (make deps-istio) to build istiod and the CRDs once per machine (%s overrides the dir), and point %s at a ztunnel binary", err, BinEnv, ZtunnelEnv)
		}
	}
	return b
}

// process is a host process in the node namespace, in its own process
// group, its output in a log file; stopped when the test ends.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Pid is the process's id (nsenter execs the binary itself).
func (p *process) Pid() int { return p.cmd.Process.Pid }

func start(t testing.TB, name string, cmd *exec.Cmd, logPath string) *process {
	t.Helper()
	p, err := startOwned(t, name, cmd, logPath)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startOwned starts cmd and stops it when owner ends. It reports failure
// rather than failing owner, which may be a parent of the running test.
func startOwned(owner testing.TB, name string, cmd *exec.Cmd, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig: a test binary killed by its -timeout runs no cleanup; the
	// signal follows the thread that forked, so that thread is held.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	owner.Cleanup(func() {
		p.stop()
		if owner.Failed() {
			// The tail alone misses a cause logged early, e.g. the
			// istio-cni agent's failure to set up what later ADDs need.
			if early := p.problems(40); early != "" {
				owner.Logf("%s log (its first 40 error and warning lines, of %s):\n%s", name, logPath, early)
			}
			owner.Logf("%s log (last 60 lines of %s):\n%s", name, logPath, p.tail(60))
		}
	})
	return p, nil
}

func (p *process) stop() {
	select {
	case <-p.done:
		return // its group may be gone and its id reused
	default:
	}
	pid := p.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
}

func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v):\n%s", p.name, p.cmd.ProcessState, p.tail(30))
	default:
		return nil
	}
}

func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// problems returns the first n lines of the log that Istio's components
// (and ztunnel) mark as errors or warnings.
func (p *process) problems(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return problemLines(string(b), n)
}

func problemLines(log string, n int) string {
	var out []string
	for _, l := range strings.SplitAfter(log, "\n") {
		if len(out) == n {
			break
		}
		if f := strings.Fields(l); len(f) > 1 && (f[1] == "error" || f[1] == "warn") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// Log returns the process's whole output so far.
func (p *process) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitFor polls cond every 200 ms until it holds, p exits or timeout.
func waitFor(t testing.TB, p *process, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if err := p.exited(); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; %s log:\n%s", timeout, what, p.name, p.tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Istiod is a running istiod.
type Istiod struct {
	*process
	// Addr is its XDS and CA address (TLS) on the node IP.
	Addr netip.AddrPort
	// RootCert is a file with the root certificate of its CA.
	RootCert string
}

// StartIstiod applies Istio's CRDs, starts istiod with an admin kubeconfig
// and waits until it has published its root certificate and :15012
// accepts.
func StartIstiod(t testing.TB, c *kcluster.Cluster, b Binaries) *Istiod {
	t.Helper()
	begin := time.Now()
	// Server-side: some of Istio's CRDs are larger than the
	// last-applied annotation kubectl's client-side apply would write.
	c.Kubectl(t, "apply", "--server-side", "-f", b.CRDs)
	c.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "-f", b.CRDs)
	if _, err := c.Client.CoreV1().Namespaces().Get(t.Context(), SystemNamespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		c.CreateNamespace(t, SystemNamespace, nil)
	}
	dir := t.TempDir()
	cmd := c.NodeCommand(b.Istiod, "discovery",
		"--kubeconfig", c.AdminKubeconfig,
		"--domain", TrustDomain,
		"--monitoringAddr", istiodMonitoring,
		"--log_output_level", "default:info",
	)
	// Its working directory holds whatever it writes relative to it.
	cmd.Dir = dir
	cmd.Env = append(cmd.Env,
		"POD_NAMESPACE="+SystemNamespace,
		"POD_NAME=istiod-test",
		"REVISION=default",
		"PILOT_CERT_PROVIDER=istiod",
		"CLUSTER_ID="+ClusterID,
		"CA_TRUSTED_NODE_ACCOUNTS="+SystemNamespace+"/"+ZtunnelSA,
		"PILOT_ENABLE_AMBIENT=true",
	)
	d := &Istiod{
		process:  start(t, "istiod", cmd, filepath.Join(dir, "istiod.log")),
		Addr:     netip.AddrPortFrom(c.NodeIP, xdsPort),
		RootCert: filepath.Join(dir, "root-cert.pem"),
	}
	var root string
	waitFor(t, d.process, "istiod to publish "+RootCertConfigMap, upTimeout, func() bool {
		cm, err := c.Client.CoreV1().ConfigMaps(SystemNamespace).Get(t.Context(), RootCertConfigMap, metav1.GetOptions{})
		if err != nil {
			return false
		}
		root = cm.Data["root-cert.pem"]
		return root != ""
	})
	if err := os.WriteFile(d.RootCert, []byte(root), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d.process, fmt.Sprintf("istiod to accept on %s", d.Addr), upTimeout, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		conn, err := c.DialContext(ctx, "tcp", d.Addr.String())
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	t.Logf("istiod up in %s (%s)", time.Since(begin).Round(time.Millisecond), d.Addr)
	return d
}

// Ztunnel is a running ztunnel.
type Ztunnel struct {
	*process
	c *kcluster.Cluster
	// Pod is the hostNetwork placeholder pod its token is bound to.
	Pod *corev1.Pod
	// owner is the test that started it: a restart's process lives as
	// long as the first one would have.
	owner testing.TB
	// command makes the same ztunnel command again, for a restart.
	command func() *exec.Cmd
}

// StartZtunnel starts ztunnel as the node's proxy, connected to istiod and
// to the node agent's ZDS socket zds, and waits until it is ready. istiod
// authorizes ztunnel's certificate requests for the node's pods through
// the pod bound into its token, so a hostNetwork placeholder pod with
// ztunnel's ServiceAccount stands where its DaemonSet pod would.
func StartZtunnel(t testing.TB, c *kcluster.Cluster, b Binaries, d *Istiod, zds string) *Ztunnel {
	t.Helper()
	begin := time.Now()
	ctx := t.Context()
	if _, err := c.Client.CoreV1().ServiceAccounts(SystemNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ZtunnelSA}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create ServiceAccount %s/%s: %v", SystemNamespace, ZtunnelSA, err)
	}
	name := "ztunnel-" + c.NodeName
	p := c.StandinPod(t, SystemNamespace, name, 0, c.NodeName, "app", "-port", fmt.Sprint(placeholderPort), "-name", name)
	p.Spec.HostNetwork = true
	p.Spec.ServiceAccountName = ZtunnelSA
	p.Spec.AutomountServiceAccountToken = ptr.To(false)
	c.CreatePod(t, p)
	pod := c.WaitPod(t, SystemNamespace, name, kcluster.DefaultTimeout, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})

	tr, err := c.Client.CoreV1().ServiceAccounts(SystemNamespace).CreateToken(ctx, ZtunnelSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{"istio-ca"},
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s bound to pod %s: %v", SystemNamespace, ZtunnelSA, pod.Name, err)
	}
	dir := t.TempDir()
	token := filepath.Join(dir, "istio-token")
	if err := os.WriteFile(token, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "https://" + d.Addr.String()
	command := func() *exec.Cmd {
		cmd := c.NodeCommand(b.Ztunnel, "proxy", "ztunnel")
		cmd.Dir = dir
		cmd.Env = append(cmd.Env,
			"XDS_ADDRESS="+addr, "CA_ADDRESS="+addr,
			"ALT_XDS_HOSTNAME="+IstiodHostname, "ALT_CA_HOSTNAME="+IstiodHostname,
			"XDS_ROOT_CA="+d.RootCert, "CA_ROOT_CA="+d.RootCert,
			"AUTH_TOKEN="+token,
			"POD_NAME="+pod.Name, "POD_NAMESPACE="+SystemNamespace, "SERVICE_ACCOUNT="+ZtunnelSA,
			"NODE_NAME="+c.NodeName, "INSTANCE_IP="+c.NodeIP.String(),
			"CLUSTER_ID="+ClusterID, "ISTIO_META_CLUSTER_ID="+ClusterID,
			"INPOD_ENABLED=true", "INPOD_UDS="+zds,
			// The DNS proxy (DNS_CAPTURE proxy metadata), on in every
			// pod's namespace at :15053, as Istio's ambient install
			// runs it. This ztunnel turns it on when the variable is
			// unset too; set, the suite does not depend on that default.
			"ISTIO_META_DNS_CAPTURE=true",
			"RUST_LOG=info",
		)
		return cmd
	}
	z := &Ztunnel{process: start(t, "ztunnel", command(), filepath.Join(dir, "ztunnel.log")), c: c, Pod: pod, owner: t, command: command}
	z.waitReady(t)
	t.Logf("ztunnel ready in %s (ZDS %s)", time.Since(begin).Round(time.Millisecond), zds)
	return z
}

// waitReady waits until ztunnel's readiness endpoint answers 200.
func (z *Ztunnel) waitReady(t testing.TB) {
	t.Helper()
	readyURL := fmt.Sprintf("http://%s/healthz/ready", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ztunnelReady))
	waitFor(t, z.process, "ztunnel ready at "+readyURL, upTimeout, func() bool {
		code, _, err := z.get(t.Context(), readyURL)
		return err == nil && code == http.StatusOK
	})
}

// Restart stops ztunnel as its DaemonSet pod's deletion does (SIGTERM,
// SIGKILL after 5 s), leaves the node without it for down (a replacement
// pod takes seconds to start), starts the same command again, with the
// same token, into the same log, and waits until it is ready. It returns
// how long the old one took to stop and the new one to be ready.
func (z *Ztunnel) Restart(t testing.TB, down time.Duration) (stopped, ready time.Duration) {
	t.Helper()
	begin := time.Now()
	z.stop()
	stopped = time.Since(begin)
	time.Sleep(down)
	p, err := startOwned(z.owner, "ztunnel", z.command(), z.log)
	if err != nil {
		t.Fatal(err)
	}
	z.process = p
	begin = time.Now()
	z.waitReady(t)
	return stopped, time.Since(begin)
}

// get fetches url from inside the node namespace.
func (z *Ztunnel) get(ctx context.Context, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return z.c.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// ConfigDump returns ztunnel's admin config_dump (workloads, services,
// policies, and the certificates it holds per identity).
func (z *Ztunnel) ConfigDump(t testing.TB) []byte {
	t.Helper()
	code, b, err := z.get(t.Context(), "http://"+ztunnelAdmin+"/config_dump")
	if err == nil && code != http.StatusOK {
		err = errors.New(http.StatusText(code))
	}
	if err != nil {
		t.Fatalf("ztunnel config_dump: %v", err)
	}
	return b
}

// SPIFFE is the identity istiod issues to a pod of ServiceAccount sa in
// namespace ns.
func SPIFFE(ns, sa string) string {
	return fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", TrustDomain, ns, sa)
}

// WaitLog waits until ztunnel's log has a line containing every one of
// parts, and returns it.
func (z *Ztunnel) WaitLog(t testing.TB, timeout time.Duration, parts ...string) string {
	t.Helper()
	var found string
	waitFor(t, z.process, fmt.Sprintf("a ztunnel log line with %q", parts), timeout, func() bool {
		found = z.FindLog(t, parts...)
		return found != ""
	})
	return found
}

// FindLog returns the last line of ztunnel's log containing every one of
// parts, or "".
func (z *Ztunnel) FindLog(t testing.TB, parts ...string) string {
	t.Helper()
	lines := strings.Split(z.Log(t), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		ok := true
		for _, p := range parts {
			if !strings.Contains(lines[i], p) {
				ok = false
				break
			}
		}
		if ok {
			return lines[i]
		}
	}
	return ""
}
