package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nftredir/nftredir/internal/kubelookup"
	"github.com/nftredir/nftredir/internal/testkit/helmbin"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/kube"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// dsNamespace and dsSelector are the chart's, installed as docs/deploy.md
// says: release nftredir in namespace nftredir-system.
const (
	dsNamespace = "nftredir-system"
	dsRelease   = "nftredir"
	dsSelector  = "app.kubernetes.io/name=nftredir"
	// dsClientUID dials pods from the node: any uid but the kubelet's.
	dsClientUID = 4343
)

// dsHost is the node's side of the DaemonSet's hostPaths, moved into the
// test's temporary directories.
type dsHost struct {
	run, ztunnel, cniBinLib, cniData, cniLog string
}

func (h dsHost) socket() string { return filepath.Join(h.run, "nftredir.sock") }

// writeDSValues writes the values file of the test's helm install: the
// chart's defaults but what must differ in the test cluster: the host
// directories (the cluster's CNI dirs, temporary dirs instead of the
// machine's /run/nftredir, /var/run/ztunnel and /var/lib/cni/nftredir,
// and a second CNI bin dir standing for Debian's /usr/lib/cni), the
// primary network's name, the plugin's log, and the image pull policy
// (the image is imported, there is no registry).
func writeDSValues(t *testing.T, c *kcluster.Cluster, h dsHost) string {
	t.Helper()
	values := map[string]any{
		"image": map[string]any{"pullPolicy": "Never"},
		// No node proxy runs unless the test starts one (then it installs
		// withProxy): with the chart's default every mesh pod would wait
		// for a ZDS proxy's ack that never comes.
		"zdsRequireAck": false,
		"hostPaths": map[string]any{
			"cniBinDirs": []string{c.CNIBinDir, h.cniBinLib},
			"cniConfDir": c.CNIConfDir,
			"runDir":     h.run,
			"ztunnelDir": h.ztunnel,
		},
		"cni": map[string]any{
			"confName":     kcluster.ConflistName,
			"pluginConfig": map[string]any{"dataDir": h.cniData, "logFile": h.cniLog, "logLevel": "debug"},
		},
	}
	b, err := json.MarshalIndent(values, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	// JSON is YAML: helm reads it as a values file.
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// chartRBAC is the chart's ServiceAccount and RBAC, for the tests that
// run nftredird as a host process with its identity.
func chartRBAC(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	return helm(t, c, "template", dsRelease, filepath.Join(binaries(t).Repo, "charts", "nftredir"),
		"--namespace", dsNamespace, "--show-only", "templates/rbac.yaml")
}

// helm runs the pinned helm against the cluster, inside its node
// namespace, with no user configuration of the machine's.
func helm(t *testing.T, c *kcluster.Cluster, args ...string) string {
	t.Helper()
	out, err := helmErr(t, c, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func helmErr(t *testing.T, c *kcluster.Cluster, args ...string) (string, error) {
	t.Helper()
	bin, err := helmbin.Path()
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.NodeCommand(bin, append(args, "--kubeconfig", c.AdminKubeconfig)...)
	home := t.TempDir()
	cmd.Env = append(cmd.Env, "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// newDSHost makes the node's side of the DaemonSet's hostPaths in the
// test's temporary directories, and logs the pods' and the plugin's logs
// if the test fails. The plugin's log is in the cluster's own directory:
// the cluster's teardown runs CNI DELs after the test's other cleanups,
// and a log in a test's temporary directory would be written again once
// that is gone, and left behind.
func newDSHost(t *testing.T, c *kcluster.Cluster) dsHost {
	t.Helper()
	tmp := t.TempDir()
	logDir, err := os.MkdirTemp(c.Dir, "nftredir-cni-log-")
	if err != nil {
		t.Fatal(err)
	}
	h := dsHost{
		run:       filepath.Join(tmp, "run"),
		ztunnel:   filepath.Join(tmp, "ztunnel"),
		cniBinLib: filepath.Join(tmp, "cni-lib"),
		cniData:   filepath.Join(tmp, "cni-data"),
		cniLog:    filepath.Join(logDir, "cni.log"),
	}
	// There before the pod, as a node's own directories are: the install
	// step copies the plugin into both bin dirs.
	for _, d := range []string{h.run, h.ztunnel, h.cniBinLib} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("DaemonSet pods' logs:\n%s", dsLogs(c))
			if b, err := os.ReadFile(h.cniLog); err == nil {
				t.Logf("nftredir-cni log:\n%s", b)
			}
		}
	})
	return h
}

// dsPods are the DaemonSet's pods that are not being deleted.
func dsPods(t *testing.T, c *kcluster.Cluster) []corev1.Pod {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(dsNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: dsSelector})
	if err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// waitDSPodReady waits for a Ready DaemonSet pod other than those named
// in not, and returns it.
func waitDSPodReady(t *testing.T, c *kcluster.Cluster, not ...string) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * kcluster.DefaultTimeout)
	for {
		for _, p := range dsPods(t, c) {
			if !slices.Contains(not, p.Name) && kcluster.PodReady(&p) {
				return p
			}
		}
		if time.Now().After(deadline) {
			out, _ := c.KubectlErr(nil, "-n", dsNamespace, "describe", "pods")
			t.Fatalf("no Ready nftredir pod after %s:\n%s", 2*kcluster.DefaultTimeout, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dsLogs is both containers' logs of every DaemonSet pod, for failures.
func dsLogs(c *kcluster.Cluster) string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Client.CoreV1().Pods(dsNamespace).List(ctx, metav1.ListOptions{LabelSelector: dsSelector})
	if err != nil {
		return err.Error()
	}
	for _, p := range l.Items {
		for _, ctr := range []string{"nftredird", "install-cni"} {
			raw, err := c.Client.CoreV1().Pods(dsNamespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr}).DoRaw(ctx)
			fmt.Fprintf(&b, "--- %s %s (%v):\n%s\n", p.Name, ctr, err, raw)
		}
	}
	return b.String()
}

// conflistTypes are the plugin types of the primary network, in order.
func conflistTypes(t *testing.T, c *kcluster.Cluster) ([]string, map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(c.CNIConfDir, kcluster.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		t.Fatalf("%s: %v\n%s", kcluster.ConflistName, err, raw)
	}
	if l.CNIVersion != c.ConflistVersion {
		t.Errorf("%s has cniVersion %q; the primary CNI wrote %q", kcluster.ConflistName, l.CNIVersion, c.ConflistVersion)
	}
	var types []string
	var entry map[string]any
	for _, p := range l.Plugins {
		typ, _ := p["type"].(string)
		types = append(types, typ)
		if typ == "nftredir-cni" {
			entry = p
		}
	}
	return types, entry
}

// waitCRINetwork waits until containerd's loaded network has the plugin
// chained (want) or not, so the next sandbox goes through it.
func waitCRINetwork(t *testing.T, c *kcluster.Cluster, want bool) {
	t.Helper()
	rs := c.CRI(t)
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		has, err := criHasPlugin(t.Context(), rs)
		if err == nil && has == want {
			return
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("containerd's network has nftredir-cni=%v after 30s, want %v (err %v)", has, want, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func criHasPlugin(ctx context.Context, rs runtimeapi.RuntimeServiceClient) (bool, error) {
	src, err := kcluster.LoadedConflist(ctx, rs)
	if err != nil {
		return false, err
	}
	var l struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(src), &l); err != nil {
		return false, err
	}
	for _, p := range l.Plugins {
		if p.Type == "nftredir-cni" {
			return true, nil
		}
	}
	return false, nil
}

// rewriteConflist replaces the primary network with bridge alone, as a
// primary CNI's own installer does (write a temporary file, rename), and
// returns what it wrote.
func rewriteConflist(t *testing.T, c *kcluster.Cluster) []byte {
	t.Helper()
	b, err := json.MarshalIndent(map[string]any{"cniVersion": c.ConflistVersion, "name": "kcluster", "plugins": []any{c.BridgePlugin()}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(c.CNIConfDir, ".primary-"+kcluster.ConflistName)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.CNIConfDir, kcluster.ConflistName)); err != nil {
		t.Fatal(err)
	}
	return b
}

// scrapeNode fetches /metrics from the daemon's port on the node IP, from the
// node namespace as Prometheus on the node's network would.
func scrapeNode(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	url := "http://" + net.JoinHostPort(c.NodeIP.String(), "15014") + "/metrics"
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

// metricValue sums the samples of a series name whose labels contain
// every string of match.
func metricValue(text, name string, match ...string) (float64, bool) {
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(line, m)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// nodeTables lists the nftables tables of the node namespace.
func nodeTables(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	out, err := c.NodeCommand("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables in the node: %v: %s", err, out)
	}
	return string(out)
}

// TestK8sDaemonSet deploys the product as a user would: the image built
// by hack/image.sh (make image: an OCI index for linux/amd64 and
// linux/arm64) imported into the node's containerd, on a node whose
// network is a bridge at cniVersion 0.3.1, and `helm install` of
// charts/nftredir with its defaults but the host directories, moved into
// the test's. The daemon runs in its container, in Kubernetes mode with
// the in-cluster ServiceAccount, and its install step chains the plugin
// into the cluster's network. Real pods, real TCP.
func TestK8sDaemonSet(t *testing.T) {
	begin := time.Now()
	img, bin := buildImage(t)
	if fi, err := os.Stat(img.tarball); err == nil {
		t.Logf("image %s (hack/image.sh, as make image): %d bytes (%.1f MiB)", imageTag, fi.Size(), float64(fi.Size())/(1<<20))
	}
	// The network at 0.3.1, as Flannel, Calico, Cilium and kindnet write
	// theirs by default.
	c := startClusterWith(t, kcluster.Options{ConflistVersion: "0.3.1"})
	h := newDSHost(t, c)
	// The primary CNI's own file, which an uninstall must give back.
	origConf, err := os.ReadFile(filepath.Join(c.CNIConfDir, kcluster.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	ci := installChart(t, c, h, nil)
	// containerd took the whole index and unpacked the node's own
	// platform: the DaemonSet's pod runs from it.
	ls, err := exec.Command(c.ToolPath("ctr"), "--address", c.ContainerdSocket, "--namespace", "k8s.io", "images", "ls", "name==docker.io/library/"+imageTag).CombinedOutput()
	if err != nil || !strings.Contains(string(ls), "linux/amd64") || !strings.Contains(string(ls), "linux/arm64") {
		t.Fatalf("ctr images ls after the import: %v\n%s\nwant docker.io/library/%s listing linux/amd64 and linux/arm64", err, ls, imageTag)
	}
	t.Logf("ctr -n k8s.io images ls after ctr images import of the index:\n%s", ls)
	rendered := helm(t, c, "template", dsRelease, filepath.Join(bin.Repo, "charts", "nftredir"), "--namespace", dsNamespace, "-f", ci.Values[0])
	for _, want := range []string{h.socket(), c.CNIBinDir, c.CNIConfDir, h.cniBinLib, "imagePullPolicy: Never", `image: "nftredir:dev"`} {
		if !strings.Contains(rendered, want) {
			t.Fatalf("helm template -f %s lacks %q:\n%s", ci.Values[0], want, rendered)
		}
	}
	for _, never := range []string{"path: /run/nftredir\n", "path: /var/run/ztunnel\n", "path: /etc/cni/net.d\n", "path: /opt/cni/bin\n", "path: /usr/lib/cni\n"} {
		if strings.Contains(rendered, never) {
			t.Fatalf("the values still mount the machine's %q", strings.TrimSpace(never))
		}
	}

	daemonPod := ci.Pod
	t.Run("DaemonSet pod Ready", func(t *testing.T) {
		t.Logf("DaemonSet pod %s Ready %s after helm install", daemonPod.Name, ci.Took.Round(time.Millisecond))
		t.Logf("kubectl get ds,pods -A -o wide:\n%s", c.Kubectl(t, "get", "ds,pods", "-A", "-o", "wide"))
		if !daemonPod.Spec.HostNetwork || daemonPod.Status.PodIP != c.NodeIP.String() {
			t.Errorf("daemon pod hostNetwork=%v IP %s; want the node's %s", daemonPod.Spec.HostNetwork, daemonPod.Status.PodIP, c.NodeIP)
		}
		for _, cs := range daemonPod.Status.ContainerStatuses {
			if !cs.Ready || cs.RestartCount != 0 {
				t.Errorf("container %s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("install step chained the plugin", func(t *testing.T) {
		types, entry := conflistTypes(t, c)
		if len(types) != 2 || types[0] != "bridge" || types[1] != "nftredir-cni" {
			t.Fatalf("%s plugins %v; want [bridge nftredir-cni]", kcluster.ConflistName, types)
		}
		if entry["socket"] != h.socket() || entry["dataDir"] != h.cniData {
			t.Errorf("entry %v; want socket %s and dataDir %s", entry, h.socket(), h.cniData)
		}
		for _, d := range []string{c.CNIBinDir, h.cniBinLib} {
			fi, err := os.Stat(filepath.Join(d, "nftredir-cni"))
			if err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("plugin binary in %s: %v %v", d, fi, err)
			}
		}
		// NFTREDIR_KUBERNETES puts the install step in Kubernetes mode
		// too: the kubeconfig of the plugin's own lookups, from the
		// pod's service account, next to the conflist.
		kc := filepath.Join(c.CNIConfDir, "nftredir-cni.kubeconfig")
		if k, _ := entry["kubernetes"].(map[string]any); k["kubeconfig"] != kc {
			t.Errorf("entry's kubernetes key %v; want the kubeconfig %s", entry["kubernetes"], kc)
		}
		if fi, err := os.Stat(kc); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("plugin kubeconfig: %v %v", fi, err)
		}
		// It reads the API as the plugin would, from the node: the
		// pod's projected token, the cluster CA, the Service address.
		lc, err := kubelookup.Load(kc, kubelookup.WithDialContext(c.DialContext))
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := lc.NamespaceLabels(ctx, "kube-system"); err != nil {
			t.Errorf("the plugin's kubeconfig does not read the API: %v", err)
		}
		raw, _ := os.ReadFile(filepath.Join(c.CNIConfDir, kcluster.ConflistName))
		t.Logf("%s after the install step:\n%s", kcluster.ConflistName, raw)
		waitCRINetwork(t, c, true)
	})
	if t.Failed() {
		t.FailNow()
	}

	api := ci.API
	m := &meshCluster{Cluster: c, api: api}
	inSync := func(t *testing.T, p *corev1.Pod) *nftredirv1.Pod {
		t.Helper()
		resp, err := api.GetPod(t.Context(), string(p.UID))
		if err != nil {
			t.Fatalf("GetPod %s: %v", p.UID, err)
		}
		if resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
			t.Fatalf("pod %s is %v: %s", p.UID, resp.GetSyncStatus(), resp.GetDetail())
		}
		return resp.GetPod()
	}

	// The ConfigMap names the kubelet's uid, 0: the node probe table lets
	// root's TCP from the node to pods through uncaptured (the kubelet's
	// probes), so a client of another uid shows capture.
	dialer := nstest.DialChildBinary(t)
	rec := nstest.NewRecorder()
	captured := func(t *testing.T, p *corev1.Pod) {
		t.Helper()
		to := netip.AddrPortFrom(mustAddr(t, p.Status.PodIP), 8080)
		if r := c.Netns.DialAs(t, dialer, rec, dsClientUID, to); r.Listener != nstest.ProxyInbound {
			t.Fatalf("uid %d -> %s answered by %q; want the proxy's inbound listener (captured)", dsClientUID, to, r.Listener)
		}
	}

	var web *corev1.Pod
	var webNetns *nstest.Netns
	top := t
	t.Run("mesh pod captured", func(t *testing.T) {
		c.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
		web = m.runPod(t, "mesh", "web")
		pr := inSync(t, web)
		if pr.GetPodName() != "web" || pr.GetPodNamespace() != "mesh" || !strings.Contains(pr.GetNetnsPath(), "/netns/cni-") {
			t.Fatalf("record %+v; want mesh/web in containerd's netns", pr)
		}
		// Owned by the whole test: it must outlive this step.
		webNetns = &nstest.Netns{Name: filepath.Base(pr.GetNetnsPath()), Path: pr.GetNetnsPath()}
		nstest.StartProxy(top, webNetns, rec, nstest.DefaultProxyPorts)
		captured(t, web)
		t.Logf("mesh/web (%s, netns %s) captured: uid %d in the node -> %s:8080 answered by %s", web.UID, pr.GetNetnsPath(), dsClientUID, web.Status.PodIP, nstest.ProxyInbound)
		// The kubelet's uid bypasses capture through the node table.
		line := m.answer(t, web)
		wantDirect(t, line, "web")
		t.Logf("uid 0 (the kubelet's) -> %s:8080: %s", web.Status.PodIP, line)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("daemon pod deleted: recreated, capture kept, reconciled", func(t *testing.T) {
		old := daemonPod.Name
		if err := c.Client.CoreV1().Pods(dsNamespace).Delete(t.Context(), old, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		captured(t, web)
		t.Logf("%s terminating: still captured", old)
		start := time.Now()
		c.WaitPodGone(t, dsNamespace, old)
		// A pod restart is not an uninstall: the plugin, its binaries and
		// the node probe table stay.
		if types, _ := conflistTypes(t, c); !slices.Contains(types, "nftredir-cni") {
			t.Fatalf("plugin unchained by a restart of the DaemonSet's pod: %v", types)
		}
		for _, d := range []string{c.CNIBinDir, h.cniBinLib} {
			if _, err := os.Stat(filepath.Join(d, "nftredir-cni")); err != nil {
				t.Fatalf("plugin binary removed by a restart: %v", err)
			}
		}
		if !strings.Contains(nodeTables(t, c), "table inet nftredir-node") {
			t.Fatalf("node probe table removed by a restart:\n%s", nodeTables(t, c))
		}
		// Between the old daemon's exit and the new one's start nothing
		// serves the node; the pod's table alone keeps it captured.
		ready := 0
		for _, p := range dsPods(t, c) {
			if kcluster.PodReady(&p) {
				ready++
			}
		}
		captured(t, web)
		t.Logf("%s gone (%s after delete), %d daemon pod(s) Ready: still captured", old, time.Since(start).Round(time.Millisecond), ready)
		daemonPod = waitDSPodReady(t, c, old)
		t.Logf("new daemon pod %s Ready %s after deleting %s", daemonPod.Name, time.Since(start).Round(time.Millisecond), old)
		captured(t, web)
		inSync(t, web)
		pods, err := api.ListPods(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(pods, func(p *nftredirv1.Pod) bool { return p.GetPodUid() == string(web.UID) }) {
			t.Errorf("the new daemon's ListPods lacks mesh/web: %v", pods)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("primary CNI rewriting its network is repaired", func(t *testing.T) {
		start := time.Now()
		origConf = rewriteConflist(t, c)
		deadline := start.Add(10 * time.Second)
		for {
			types, _ := conflistTypes(t, c)
			if slices.Contains(types, "nftredir-cni") {
				t.Logf("plugin chained again %s after the rewrite (plugins %v)", time.Since(start).Round(time.Millisecond), types)
				// The next pod (below) goes through the repaired network.
				waitCRINetwork(t, c, true)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("plugin not back in %s 10s after the rewrite: %v", kcluster.ConflistName, types)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// The new daemon found web in line at its start; a second pod
		// gives it an AddPod (and an apply) of its own.
		p := m.runPod(t, "mesh", "second")
		inSync(t, p)
		text := scrapeNode(t, c)
		n, ok := metricValue(text, "nftredir_pod_apply_duration_seconds_count")
		if !ok || n < 1 {
			t.Errorf("nftredir_pod_apply_duration_seconds_count = %v (present %v); want >= 1", n, ok)
		}
		if n, ok := metricValue(text, "nftredir_grpc_server_handled_total", `method="AddPod"`, `code="OK"`); !ok || n < 1 {
			t.Errorf("nftredir_grpc_server_handled_total{AddPod,OK} = %v (present %v); want >= 1", n, ok)
		}
		// Idle, with nothing changing, the daemon applies nothing (the
		// sweep re-checks each pod every 30s): a count that keeps climbing
		// is a loop re-programming tables.
		time.Sleep(2 * time.Second)
		later, _ := metricValue(scrapeNode(t, c), "nftredir_pod_apply_duration_seconds_count")
		t.Logf("nftredir_pod_apply_duration_seconds_count: %v, and %v 2s later with the node idle", n, later)
		if later-n > 4 {
			t.Errorf("%v pod table applies in 2s on an idle node with 2 pods; want next to none", later-n)
		}
		var excerpt []string
		for line := range strings.SplitSeq(text, "\n") {
			if strings.HasPrefix(line, "nftredir_") && !strings.Contains(line, "_bucket{") {
				excerpt = append(excerpt, line)
			}
		}
		t.Logf("curl http://%s:15014/metrics | grep ^nftredir_ | grep -v _bucket:\n%s", c.NodeIP, strings.Join(excerpt, "\n"))
	})

	t.Run("rolling update keeps capture", func(t *testing.T) {
		old := daemonPod.Name
		c.Kubectl(t, "-n", dsNamespace, "rollout", "restart", "daemonset/nftredir")
		c.Kubectl(t, "-n", dsNamespace, "rollout", "status", "daemonset/nftredir", "--timeout=120s")
		daemonPod = waitDSPodReady(t, c, old)
		if types, _ := conflistTypes(t, c); !slices.Contains(types, "nftredir-cni") {
			t.Fatalf("plugin unchained by a rolling update: %v", types)
		}
		if !strings.Contains(nodeTables(t, c), "table inet nftredir-node") {
			t.Fatalf("node probe table removed by a rolling update:\n%s", nodeTables(t, c))
		}
		captured(t, web)
		inSync(t, web)
		t.Logf("rolled from %s to %s: plugin chained, mesh/web captured and in sync", old, daemonPod.Name)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("deleting the DaemonSet uninstalls", func(t *testing.T) {
		if !strings.Contains(nodeTables(t, c), "table inet nftredir-node") {
			t.Fatalf("no inet nftredir-node in the node before uninstall (NFTREDIR_KUBELET_UID=0 should make it):\n%s", nodeTables(t, c))
		}
		pods, err := api.ListPods(t.Context())
		if err != nil || len(pods) == 0 {
			t.Fatalf("ListPods before uninstall: %v %v", pods, err)
		}
		captured(t, web)
		// Annotated, so that its removal below is the uninstall's.
		c.WaitPod(t, "mesh", "web", kcluster.DefaultTimeout, kube.RedirectionAnnotation+" set", func(p *corev1.Pod) bool {
			return p.Annotations[kube.RedirectionAnnotation] != ""
		})
		// One step, as a user takes nftredir off (docs/deploy.md): the
		// pre-delete hook deletes the DaemonSet and waits for its pods,
		// then helm deletes the rest.
		start := time.Now()
		t.Logf("helm uninstall:\n%s", helm(t, c, "uninstall", dsRelease, "--namespace", dsNamespace, "--wait", "--timeout", "120s"))
		deadline := time.Now().Add(kcluster.DefaultTimeout)
		for len(dsAllPods(t, c)) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("DaemonSet pods still there %s after helm uninstall", kcluster.DefaultTimeout)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, err := c.Client.AppsV1().DaemonSets(dsNamespace).Get(t.Context(), dsRelease, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("DaemonSet %s/%s after helm uninstall: %v; want NotFound", dsNamespace, dsRelease, err)
		}
		t.Logf("DaemonSet deleted, pods gone in %s; %d captured pod(s) before", time.Since(start).Round(time.Millisecond), len(pods))
		got, err := os.ReadFile(filepath.Join(c.CNIConfDir, kcluster.ConflistName))
		if err != nil || !bytes.Equal(got, origConf) {
			t.Errorf("%s after uninstall (%v):\n%s\nwant the primary CNI's bytes:\n%s", kcluster.ConflistName, err, got, origConf)
		}
		for _, d := range []string{c.CNIBinDir, h.cniBinLib} {
			if _, err := os.Lstat(filepath.Join(d, "nftredir-cni")); err == nil {
				t.Errorf("plugin binary still in %s", d)
			}
		}
		// The plugin's kubeconfig, or anything else, gone from the conf dir.
		if ents, err := os.ReadDir(c.CNIConfDir); err != nil || len(ents) != 1 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s after uninstall: %v %v; want %s alone", c.CNIConfDir, names, err, kcluster.ConflistName)
		}
		tables := nodeTables(t, c)
		if strings.Contains(tables, "nftredir") {
			t.Errorf("nftredir table left in the node after uninstall:\n%s", tables)
		}
		// Records, sockets, markers: nothing of nftredir in its run dir.
		var left []string
		filepath.WalkDir(h.run, func(p string, d os.DirEntry, err error) error {
			if p != h.run {
				left = append(left, strings.TrimPrefix(p, h.run))
			}
			return nil
		})
		if len(left) > 0 {
			t.Errorf("left in /run/nftredir after uninstall: %v", left)
		}
		// Captured pods released (the default): their table gone, the
		// annotation cleared, and they answer directly.
		if out, err := webNetns.Exec("nft", "list", "tables"); err != nil || strings.Contains(out, "nftredir") {
			t.Errorf("mesh/web's namespace after uninstall (%v):\n%s", err, out)
		}
		// uid 0 bypassed capture through the probe table; another uid
		// shows it is gone.
		line := c.Netns.DialAsLine(t, dialer, dsClientUID, netip.AddrPortFrom(mustAddr(t, web.Status.PodIP), 8080))
		wantDirect(t, line, "web")
		// The redirection annotation is cleared: the chart's pre-delete
		// hook keeps the RBAC until the daemon has stopped (helm alone
		// deletes it right after the DaemonSet, before its pods stop).
		if p, err := c.Client.CoreV1().Pods("mesh").Get(t.Context(), "web", metav1.GetOptions{}); err != nil {
			t.Error(err)
		} else if v, ok := p.Annotations[kube.RedirectionAnnotation]; ok {
			t.Errorf("mesh/web's %s annotation after uninstall: %q; want it taken off", kube.RedirectionAnnotation, v)
		}
		t.Logf("after uninstall: %s has the primary CNI's %d bytes again, no binary; node tables:\n%s\nmesh/web answers %q", kcluster.ConflistName, len(got), tables, line)
		// New pods start, in the mesh namespace too, uncaptured.
		waitCRINetwork(t, c, false)
		p := m.runPod(t, "mesh", "after")
		wantDirect(t, m.answer(t, p), "after")
		t.Logf("new pod mesh/after Ready and answering directly %s after the delete", time.Since(start).Round(time.Millisecond))
	})
	t.Logf("TestK8sDaemonSet took %s", time.Since(begin).Round(time.Millisecond))
}

// dsAllPods lists the DaemonSet's pods, terminating ones included.
func dsAllPods(t *testing.T, c *kcluster.Cluster) []corev1.Pod {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(dsNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: dsSelector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}
