package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// The Kubernetes tests run a real single-node cluster (internal/testkit/kcluster)
// built from the machine-wide cache hack/k8s-tools.sh fills; `make test`
// and `make e2e-k8s` fill it first. Their names start with TestK8s.

// skipK8sEnv turns the cluster tests into skips, for a machine where the
// Kubernetes binaries cannot be built. Failing is the default: a silently
// skipped cluster suite looks exactly like a passing one.
const skipK8sEnv = "NFTREDIR_SKIP_K8S"

// startCluster brings up the cluster, torn down when the test ends.
func startCluster(t *testing.T) *kcluster.Cluster {
	t.Helper()
	return startClusterWith(t, kcluster.Options{})
}

// startClusterWith is startCluster with options (the repository is
// filled in).
func startClusterWith(t *testing.T, o kcluster.Options) *kcluster.Cluster {
	t.Helper()
	nstest.RequirePrivileged(t)
	if os.Getenv(skipK8sEnv) == "1" {
		t.Skipf("Kubernetes cluster tests skipped because %s=1", skipK8sEnv)
	}
	o.Repo = binaries(t).Repo
	return kcluster.Start(t, o)
}

// k8sWorld is a cluster whose pod network ends in nftredir-cni, talking to
// an nftredird that runs as a host process in the node namespace
// (standalone mode: it learns pods from CNI only).
type k8sWorld struct {
	c         *kcluster.Cluster
	daemon    *nftredird
	pluginLog string
}

func newK8sWorld(t *testing.T) *k8sWorld {
	t.Helper()
	// Made before the cluster: its teardown's CNI DELs write the plugin's
	// log here (see newMeshCluster).
	dir := t.TempDir()
	c := startCluster(t)
	bins := binaries(t)
	w := &k8sWorld{c: c, pluginLog: filepath.Join(dir, "nftredir-cni.log")}
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(w.pluginLog); err == nil {
				t.Logf("%s:\n%s", w.pluginLog, b)
			}
		}
	})
	w.daemon = startDaemon(t, daemonOpts{dir: dir, netns: c.Netns.Path})
	c.InstallCNIPlugin(t, "nftredir-cni", bins.CNI)
	c.WriteConflist(t, map[string]any{
		"type":              "nftredir-cni",
		"socket":            w.daemon.socket,
		"timeout":           "10s",
		"dataDir":           filepath.Join(dir, "cni-data"),
		"logFile":           w.pluginLog,
		"logLevel":          "debug",
		"excludeNamespaces": []string{"kube-system"},
	})
	return w
}

// TestK8sClusterSmoke: a pod on the real cluster goes through bridge,
// host-local and nftredir-cni; it becomes Ready, is enrolled under its API
// UID, real TCP from the node to it is captured by the proxy in the pod,
// and deleting it releases it (CNI DEL). A kube-system pod (excluded) is
// left alone and answers directly.
func TestK8sClusterSmoke(t *testing.T) {
	begin := time.Now()
	w := newK8sWorld(t)
	c := w.c
	cl := w.daemon.client(t)
	if n := c.WaitNodeReady(t); n.Status.NodeInfo.KubeletVersion != kcluster.KubeVersion {
		t.Errorf("node runs kubelet %s, want %s", n.Status.NodeInfo.KubeletVersion, kcluster.KubeVersion)
	}
	ns := "smoke-" + strings.TrimPrefix(c.Netns.Name, nstest.NamePrefix)
	c.CreateNamespace(t, ns, nil)

	// The app and a stand-in for the node proxy, side by side as with a
	// captured workload; the proxy needs NET_ADMIN for its transparent
	// sockets and proxy mark. Placed by the scheduler.
	pod := c.StandinPod(t, ns, "web", 8080, "", "app", "-port", "8080", "-name", "web")
	proxy := pod.Spec.Containers[0].DeepCopy()
	proxy.Name, proxy.Args, proxy.ReadinessProbe = "proxy", []string{"proxy"}, nil
	proxy.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
	pod.Spec.Containers = append(pod.Spec.Containers, *proxy)
	created := c.CreatePod(t, pod)
	ready := c.WaitPodReady(t, ns, "web")
	if ready.Spec.NodeName != c.NodeName {
		t.Errorf("pod scheduled to %q, want %q", ready.Spec.NodeName, c.NodeName)
	}
	podIP := ready.Status.PodIP
	if !c.PodSubnet.Contains(mustAddr(t, podIP)) {
		t.Fatalf("pod IP %q outside the pod subnet %s", podIP, c.PodSubnet)
	}

	// Enrolled by the CNI ADD containerd ran, under the API's UID.
	uid := string(created.UID)
	got := getPod(t, cl, uid)
	if got == nil {
		t.Fatalf("pod %s/web (uid %s) not enrolled; enrolled: %v", ns, uid, listUIDs(t, cl))
	}
	if p := got.GetPod(); p.GetPodName() != "web" || p.GetPodNamespace() != ns || !strings.Contains(p.GetNetnsPath(), "/netns/cni-") {
		t.Errorf("enrolled as %+v; want web in %s with containerd's netns", p, ns)
	}

	// Real TCP from the node namespace to the pod's app port: captured
	// inbound and answered by the proxy, which names the original
	// destination.
	line := dialLine(t, c, podIP+":8080")
	t.Logf("node -> %s:8080: %s", podIP, line)
	if want := "original destination " + podIP + ":8080"; !strings.Contains(line, fmt.Sprintf("captured by proxy :%d", defaults.InboundPort)) || !strings.Contains(line, want) {
		t.Errorf("node -> %s:8080 answered %q; want the proxy's inbound capture with %q", podIP, line, want)
	}

	// An excluded namespace: no capture, the app answers itself.
	sys := c.StandinPod(t, "kube-system", "plain", 8080, c.NodeName, "app", "-port", "8080", "-name", "plain")
	c.CreatePod(t, sys)
	plain := c.WaitPodReady(t, "kube-system", "plain")
	line = dialLine(t, c, plain.Status.PodIP+":8080")
	t.Logf("node -> %s:8080: %s", plain.Status.PodIP, line)
	if !strings.Contains(line, "answered directly by plain") {
		t.Errorf("node -> kube-system pod answered %q; want the app itself", line)
	}
	if n := len(listUIDs(t, cl)); n != 1 {
		t.Errorf("daemon has %d pods enrolled; want only web", n)
	}

	// kubectl sees what the API does (and runs in the node namespace).
	if out := c.Kubectl(t, "get", "pod", "-n", ns, "web", "-o", "jsonpath={.status.podIP}"); out != podIP {
		t.Errorf("kubectl get pod web: podIP %q, want %q", out, podIP)
	}

	testK8sServiceAccount(t, c, ns)
	testK8sServiceIP(t, c)

	// Deleting the pod stops its sandbox: CNI DEL releases it.
	c.DeletePod(t, ns, "web")
	if got := getPod(t, cl, uid); got != nil {
		t.Errorf("pod %s still enrolled after kubectl delete: %+v", uid, got)
	}
	c.DeletePod(t, "kube-system", "plain")
	t.Logf("smoke test body took %s", time.Since(begin).Round(time.Millisecond))
}

// dialLine connects from the node namespace and returns the first line.
func dialLine(t *testing.T, c *kcluster.Cluster, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	conn, err := c.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from the node: %v", addr, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", addr, err)
	}
	return strings.TrimSpace(line)
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	return a
}

// testK8sServiceAccount: RBAC is on, and a ServiceAccount token minted
// through TokenRequest authenticates as that account, with exactly the
// rights its Role grants.
func testK8sServiceAccount(t *testing.T, c *kcluster.Cluster, ns string) {
	t.Helper()
	c.ApplyYAML(t, fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: %[1]s}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: %[1]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects:
- {kind: ServiceAccount, name: reader, namespace: %[1]s}
`, ns))
	kc := c.ServiceAccountKubeconfig(t, ns, "reader")
	who, err := c.KubectlAs(kc, nil, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	if err != nil || who != "system:serviceaccount:"+ns+":reader" {
		t.Errorf("kubectl auth whoami with the minted token: %q, %v", who, err)
	}
	if _, err := c.KubectlAs(kc, nil, "get", "pods", "-n", ns); err != nil {
		t.Errorf("reader cannot list pods in %s: %v", ns, err)
	}
	if out, err := c.KubectlAs(kc, nil, "get", "pods", "-n", "kube-system"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("reader listed pods in kube-system (%q, %v); want Forbidden from RBAC", out, err)
	}
}

// testK8sServiceIP: the "kubernetes" Service IP reaches the apiserver
// from the node, whose certificate is valid for that address, as an
// in-cluster client needs.
func testK8sServiceIP(t *testing.T, c *kcluster.Cluster) {
	t.Helper()
	svc, err := c.Client.CoreV1().Services("default").Get(t.Context(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != c.APIServiceIP.String() {
		t.Errorf("kubernetes Service IP %s, want %s", svc.Spec.ClusterIP, c.APIServiceIP)
	}
	caPEM, err := os.ReadFile(c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conn, err := c.DialContext(t.Context(), "tcp", net.JoinHostPort(svc.Spec.ClusterIP, "443"))
	if err != nil {
		t.Fatalf("dial the kubernetes Service from the node: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: svc.Spec.ClusterIP})
	if err := tc.Handshake(); err != nil {
		t.Errorf("TLS to the apiserver through the Service IP: %v", err)
	}
}
