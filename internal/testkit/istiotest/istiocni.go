package istiotest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/testkit/kcluster"
)

// Names and ports of the istio-cni node agent, as Istio's istio-cni chart
// has them (manifests/charts/istio-cni).
const (
	// IstioCNISA is the agent's ServiceAccount in SystemNamespace.
	IstioCNISA = "istio-cni"
	// istioCNIReady is its readiness port (constants.ReadinessPort), on
	// every interface of the node namespace: not configurable.
	istioCNIReady = 8000
	// istioCNIMonitoring moves its metrics off 15014, nftredird's.
	istioCNIMonitoring = 15214
	// IstioCNIEnablementSelector is the chart's default
	// ambient.enablementSelectors, as the chart renders it into
	// AMBIENT_ENABLEMENT_SELECTOR: a pod labelled
	// istio.io/dataplane-mode=ambient, or one not labelled "none" in a
	// namespace labelled ambient. Empty, the agent treats no pod as
	// ambient.
	IstioCNIEnablementSelector = `- podSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
- podSelector:
    matchExpressions:
    - { key: istio.io/dataplane-mode, operator: NotIn, values: [none] }
  namespaceSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
`
)

// istioCNIRBAC is what the istio-cni chart grants its agent
// (templates/clusterrole.yaml, clusterrolebinding.yaml), less the repair
// controller's (off here: it acts on sidecar pods only).
const istioCNIRBAC = `apiVersion: v1
kind: ServiceAccount
metadata: {name: istio-cni, namespace: istio-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: istio-cni}
rules:
- apiGroups: [""]
  resources: ["pods","nodes","namespaces"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: istio-cni-ambient}
rules:
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch", "update"]
- apiGroups: ["apps"]
  resources: ["daemonsets"]
  resourceNames: ["istio-cni-node"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: istio-cni}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: istio-cni}
subjects: [{kind: ServiceAccount, name: istio-cni, namespace: istio-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: istio-cni-ambient}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: istio-cni-ambient}
subjects: [{kind: ServiceAccount, name: istio-cni, namespace: istio-system}]
`

// CNIBinaries are istio-cni's two programs, built by hack/istio-tools.sh
// beside istiod.
type CNIBinaries struct {
	Plugin string // istio-cni, the CNI plugin
	Agent  string // install-cni, the installer and node agent
}

// RequireIstioCNI returns istio-cni's binaries from BinDir, failing the
// test with how to build them when they are missing.
func RequireIstioCNI(t testing.TB) CNIBinaries {
	t.Helper()
	dir := BinDir()
	b := CNIBinaries{Plugin: filepath.Join(dir, "istio-cni"), Agent: filepath.Join(dir, "install-cni")}
	for _, f := range []string{b.Plugin, b.Agent} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("istio-cni: %v; run hack/istio-tools.sh (make deps-istio) to build it once per machine (%s overrides the dir)", err, BinEnv)
		}
	}
	return b
}

// IstioCNIOptions shape the agent.
type IstioCNIOptions struct {
	// ZDS is the socket ztunnel connects to (ZTUNNEL_UDS_ADDRESS), a
	// path on the machine.
	ZDS string
	// NativeNftables selects Istio's nftables backend for the in-pod
	// rules (NATIVE_NFTABLES) instead of iptables.
	NativeNftables bool
}

// IstioCNI is a running istio-cni node agent.
type IstioCNI struct {
	*process
	c *kcluster.Cluster
	// RunDir is CNI_AGENT_RUN_DIR: the plugin's socket and kubeconfig, on
	// the machine's path as the plugin (run by containerd) finds it.
	RunDir string
}

// StartIstioCNI runs istio-cni's node agent (install-cni) on the node as
// its DaemonSet would, and waits until it is ready and containerd has
// loaded the network with istio-cni chained. Outside a DaemonSet it gets
// the pod's filesystem from a private root (see istioCNIRoot); it runs in
// the node network namespace, in a mount namespace that is a slave of the
// machine's (new netns pins reach it) and in a pid namespace of its own:
// this machine's pid 1 hides /proc/1/ns/net, which the agent must stat.
// So its /proc scan for running pods finds none; pods started while it
// runs reach it through its plugin, with their netns path.
func StartIstioCNI(t testing.TB, c *kcluster.Cluster, b CNIBinaries, o IstioCNIOptions) *IstioCNI {
	t.Helper()
	begin := time.Now()
	if o.ZDS == "" {
		t.Fatal("IstioCNIOptions.ZDS is required")
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(t.Context(), SystemNamespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		c.CreateNamespace(t, SystemNamespace, nil)
	}
	c.ApplyYAML(t, istioCNIRBAC)

	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	token := c.ServiceAccountToken(t, SystemNamespace, IstioCNISA)
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	shared := []string{runDir, filepath.Dir(o.ZDS)}
	script, err := istioCNIRoot(root, map[string]string{"token": token, "ca.crt": string(ca), "namespace": SystemNamespace}, shared)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat("/var/run/netns"); err != nil || !fi.IsDir() {
		t.Fatalf("istio-cni needs the runtime's netns pins at /var/run/netns: %v", err)
	}

	// nsenter enters the node namespace and execs unshare; unshare forks
	// the agent as pid 1 of a new pid namespace (--kill-child: it dies
	// with unshare, which dies with the test: Pdeathsig).
	cmd := c.NodeCommand("unshare", unshareArgs(script, root, c.CNIBinDir, c.CNIConfDir, b.Plugin, b.Agent, agentInRoot)...)
	cmd.Dir = dir
	name := "istio-cni-" + c.NodeName
	cmd.Env = append(cmd.Env,
		// The chart's ConfigMap (values.yaml defaults) ...
		"AMBIENT_ENABLED=true",
		"AMBIENT_ENABLEMENT_SELECTOR="+IstioCNIEnablementSelector,
		"AMBIENT_DNS_CAPTURE=true",
		"AMBIENT_IPV6=true",
		"AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=true",
		"CHAINED_CNI_PLUGIN=true",
		"EXCLUDE_NAMESPACES=kube-system",
		"NATIVE_NFTABLES="+strconv.FormatBool(o.NativeNftables),
		"REPAIR_ENABLED=false",
		// ... and the DaemonSet's env.
		"ALLOW_SWITCH_TO_HOST_NS=true",
		"NODE_NAME="+c.NodeName, "POD_NAME="+name, "POD_NAMESPACE="+SystemNamespace,
		// What the kubelet gives every container: the kubernetes
		// Service, which the cluster DNATs to the apiserver.
		"KUBERNETES_SERVICE_HOST="+c.APIServiceIP.String(), "KUBERNETES_SERVICE_PORT=443",
		// Paths the plugin, run by containerd on the machine, must find
		// too; the metrics port away from nftredird's.
		"CNI_AGENT_RUN_DIR="+runDir,
		"ZTUNNEL_UDS_ADDRESS="+o.ZDS,
		"MONITORING_PORT="+strconv.Itoa(istioCNIMonitoring),
	)
	a := &IstioCNI{process: start(t, "istio-cni", cmd, filepath.Join(dir, "istio-cni.log")), c: c, RunDir: runDir}
	// After start's cleanup in order, so before it in time: the agent is
	// stopped the way its DaemonSet's removal stops it, and cleans up.
	t.Cleanup(func() { a.Stop(t) })

	readyURL := fmt.Sprintf("http://127.0.0.1:%d/readyz", istioCNIReady)
	waitFor(t, a.process, "istio-cni ready at "+readyURL, upTimeout, func() bool {
		code, _, err := nodeGet(t.Context(), c, readyURL)
		return err == nil && code == http.StatusOK
	})
	rs := c.CRI(t)
	waitFor(t, a.process, "containerd to load the network with istio-cni chained", upTimeout, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		src, err := kcluster.LoadedConflist(ctx, rs)
		return err == nil && strings.Contains(src, `"istio-cni"`)
	})
	t.Logf("istio-cni ready in %s (ZDS %s, run dir %s)", time.Since(begin).Round(time.Millisecond), o.ZDS, runDir)
	return a
}

// istioCNIRoot lays out root, the agent's root directory, and returns the
// script that mounts the rest of it and execs the agent there. The agent
// expects its DaemonSet pod's filesystem: its plugin at
// /opt/cni/bin/istio-cni, the node's CNI dirs at /host/opt/cni/bin and
// /host/etc/cni/net.d, /host/proc, /host/var/run/netns (recursive: each
// pin is a mount) and a service account at
// /var/run/secrets/kubernetes.io/serviceaccount. None of these paths may
// be made on the machine itself, so they live in root, and the machine's
// /usr, /etc, /dev and /sys are bound in; the paths in shared are bound
// at their own path, for what the agent and the machine must both see.
// Every mount is in the agent's mount namespace and goes with it.
func istioCNIRoot(root string, sa map[string]string, shared []string) (string, error) {
	for _, d := range []string{"usr", "etc", "dev", "sys", "proc", "tmp", "run", "var", "opt/cni/bin",
		"host/opt/cni/bin", "host/etc/cni/net.d", "host/proc", "host/var/run/netns",
		"run/secrets/kubernetes.io/serviceaccount"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	// Debian's merged /usr, and /var/run as a link to /run.
	for link, to := range map[string]string{"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64", "var/run": "../run"} {
		if err := os.Symlink(to, filepath.Join(root, link)); err != nil {
			return "", err
		}
	}
	for name, v := range sa {
		if err := os.WriteFile(filepath.Join(root, "run/secrets/kubernetes.io/serviceaccount", name), []byte(v), 0o600); err != nil {
			return "", err
		}
	}
	for _, f := range []string{"opt/cni/bin/istio-cni", agentInRoot} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o755); err != nil {
			return "", err
		}
	}
	var b strings.Builder
	// $1 root, $2 the node's CNI bin dir, $3 its conf dir, $4 the plugin,
	// $5 the agent, then the command. /proc is the new pid namespace's
	// (--mount-proc).
	b.WriteString(`root=$1
for d in usr etc dev sys; do mount --rbind /$d "$root/$d"; done
mount --bind /proc "$root/proc"
mount --bind /proc "$root/host/proc"
mount --bind "$2" "$root/host/opt/cni/bin"
mount --bind "$3" "$root/host/etc/cni/net.d"
mount --rbind /var/run/netns "$root/host/var/run/netns"
mount --bind "$4" "$root/opt/cni/bin/istio-cni"
mount --bind "$5" "$root` + agentInRoot + `"
`)
	for _, p := range shared {
		fmt.Fprintf(&b, "mkdir -p %[1]q\nmkdir -p \"$root\"%[1]q\nmount --bind %[1]q \"$root\"%[1]q\n", p)
	}
	b.WriteString("shift 5\nexec chroot \"$root\" \"$@\"\n")
	return b.String(), nil
}

// unshareArgs are unshare's arguments to run argv in root (as laid out by
// istioCNIRoot, script its script), in new mount and pid namespaces.
func unshareArgs(script, root, cniBinDir, cniConfDir, plugin, agent string, argv ...string) []string {
	return append([]string{"--mount", "--propagation", "slave", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
		"--", "/bin/sh", "-euc", script, "istio-cni-root", root, cniBinDir, cniConfDir, plugin, agent}, argv...)
}

// agentInRoot is where the root has the agent's binary.
const agentInRoot = "/usr-local-bin/install-cni"

// Stop stops the agent as the removal of its DaemonSet does: on SIGTERM,
// finding no DaemonSet istio-cni-node (there never is one here), it
// removes its conflist entry, binary and node rules, and leaves the rules
// in the pods. Stop waits until it has exited and returns how long that
// took. A second call does nothing.
func (a *IstioCNI) Stop(t testing.TB) time.Duration {
	t.Helper()
	begin := time.Now()
	select {
	case <-a.done:
		return 0
	default:
	}
	// The agent is unshare's one child; signalling unshare instead would
	// kill it at once (--kill-child), with no cleanup.
	if pid, err := onlyChild(a.cmd.Process.Pid); err == nil {
		syscall.Kill(pid, syscall.SIGTERM)
	} else {
		t.Logf("istio-cni: %v; stopping unshare", err)
		syscall.Kill(a.cmd.Process.Pid, syscall.SIGTERM)
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Errorf("istio-cni still running 30s after SIGTERM:\n%s", a.tail(30))
		a.stop()
	}
	return time.Since(begin)
}

// onlyChild is the pid of pid's one child process.
func onlyChild(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0, fmt.Errorf("process %d has children %q, want one", pid, f)
	}
	return strconv.Atoi(f[0])
}

// nodeGet fetches url from inside the node namespace.
func nodeGet(ctx context.Context, c *kcluster.Cluster, url string) (int, []byte, error) {
	z := &Ztunnel{c: c}
	return z.get(ctx, url)
}
