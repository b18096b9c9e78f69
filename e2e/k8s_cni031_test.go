package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestK8sCNI031 runs the cluster on a cniVersion 0.3.1 network, the
// version of Flannel's, Calico's, Cilium's and kindnet's defaults:
// "nftredir-cni install" chains the plugin into it, containerd loads
// it, and a pod of a mesh namespace is created through bridge at 0.3.1 and
// nftredir-cni, enrolled with its address and captured; deleting it
// releases it.
func TestK8sCNI031(t *testing.T) {
	nstest.RequirePrivileged(t)
	if os.Getenv(skipK8sEnv) == "1" {
		t.Skipf("Kubernetes cluster tests skipped because %s=1", skipK8sEnv)
	}
	bin := binaries(t)
	// Made before the cluster: its teardown's CNI DELs write the plugin's
	// log here (see newMeshCluster).
	dir := t.TempDir()
	c := kcluster.Start(t, kcluster.Options{Repo: bin.Repo, ConflistVersion: "0.3.1"})
	var primary struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(c.Conflist(), &primary); err != nil || primary.CNIVersion != "0.3.1" {
		t.Fatalf("the cluster's network is not 0.3.1 (%v):\n%s", err, c.Conflist())
	}

	c.CreateNamespace(t, "nftredir-system", nil)
	c.ApplyYAML(t, chartRBAC(t, c))
	kubeconfig := c.ServiceAccountKubeconfig(t, "nftredir-system", "nftredir")
	m := &meshCluster{Cluster: c, zds: filepath.Join(dir, "zds.sock"), cniLog: filepath.Join(dir, "cni.log")}
	m.daemon = startDaemon(t, daemonOpts{
		dir:   dir,
		netns: c.Netns.Path,
		args: []string{
			"--kubernetes", "--kubeconfig", kubeconfig, "--node-name", c.NodeName,
			// Nothing of an older daemon to move in.
			"--kubernetes-state-dir=",
			"--zds-socket", m.zds,
		},
	})
	m.api = m.daemon.client(t)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(m.cniLog); err == nil {
				t.Logf("nftredir-cni log:\n%s", b)
			}
		}
	})

	entry := filepath.Join(dir, "entry.json")
	if err := os.WriteFile(entry, []byte(`{"dataDir":"`+filepath.Join(dir, "cni-data")+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin.CNI, "install", "--once", "--cni-bin-dir", c.CNIBinDir, "--cni-conf-dir", c.CNIConfDir,
		"--plugin-config", entry, "--socket", m.daemon.socket, "--timeout", "10s",
		"--log-file", m.cniLog, "--log-level", "debug", "--exclude-namespaces", "kube-system").CombinedOutput()
	if err != nil {
		t.Fatalf("nftredir-cni install --once into the 0.3.1 network: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(c.CNIConfDir, kcluster.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type       string  `json:"type"`
			CNIVersion *string `json:"cniVersion"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &l); err != nil || l.CNIVersion != "0.3.1" || len(l.Plugins) != 2 ||
		l.Plugins[1].Type != "nftredir-cni" || l.Plugins[1].CNIVersion != nil {
		t.Fatalf("network after install (%v):\n%s", err, raw)
	}
	waitCRINetwork(t, c, true)
	if src, err := kcluster.LoadedConflist(t.Context(), c.CRI(t)); err != nil || !strings.Contains(src, `"0.3.1"`) {
		t.Fatalf("containerd's loaded network (%v):\n%s", err, src)
	}

	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	p := m.runPod(t, "mesh", "web031")
	rec := m.enrolled(t, p.UID)
	if rec == nil {
		t.Fatalf("pod %s in a labelled namespace is not enrolled through the 0.3.1 network", p.UID)
	}
	if ips := rec.GetPodIps(); len(ips) != 1 || ips[0] != p.Status.PodIP {
		t.Errorf("record IPs %v, pod IP %s", ips, p.Status.PodIP)
	}
	m.proxyIn(t, rec)
	wantCaptured(t, m.answer(t, p), "web031")
	b, err := os.ReadFile(m.cniLog)
	if err != nil || !strings.Contains(string(b), "pod enrolled") {
		t.Errorf("the plugin's log does not show the ADD (%v)", err)
	}

	m.DeletePod(t, "mesh", "web031")
	m.waitEnrolled(t, p.UID, false)
	t.Logf("0.3.1 network: pod %s (%s) enrolled, captured, released on deletion", p.UID, p.Status.PodIP)
}
