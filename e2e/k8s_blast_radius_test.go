package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/enrolment"
	"github.com/nftredir/nftredir/internal/kubelookup"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/kube"
)

// startBlastCluster is startMeshCluster with the plugin's entry as
// "nftredir-cni install --kubernetes" writes it: the kubernetes key, and
// the kubeconfig it names, made by the real installer from a token of the
// chart's read-only account for the plugin (nftredir-cni: get pods and
// namespaces, nothing else), so the lookups below show it is enough.
func startBlastCluster(t *testing.T) (*meshCluster, string) {
	t.Helper()
	// Made before the cluster: its teardown's CNI DELs write the plugin's
	// log here (see newMeshCluster).
	dir := t.TempDir()
	c := startCluster(t)
	bin := binaries(t)
	c.InstallCNIPlugin(t, "nftredir-cni", bin.CNI)
	c.InstallCNIPlugin(t, "nftredir-cni-helper", bin.CNIHelper)
	c.CreateNamespace(t, "nftredir-system", nil)
	c.ApplyYAML(t, chartRBAC(t, c))
	m := &meshCluster{Cluster: c, zds: filepath.Join(dir, "zds.sock"), cniLog: filepath.Join(dir, "cni.log")}
	m.daemon = startDaemon(t, daemonOpts{
		dir:   dir,
		netns: c.Netns.Path,
		args: []string{
			"--kubernetes", "--kubeconfig", c.ServiceAccountKubeconfig(t, "nftredir-system", "nftredir"), "--node-name", c.NodeName,
			// Nothing of an older daemon to move in.
			"--kubernetes-state-dir=",
			"--zds-socket", m.zds,
		},
	})
	m.api = m.daemon.client(t)

	// The installer, run once into a scratch conf dir holding a network
	// like the cluster's: it writes the kubeconfig there and chains its
	// entry, which then goes into the cluster's conflist.
	inst := filepath.Join(dir, "install")
	confDir, binDir, sa := filepath.Join(inst, "net.d"), filepath.Join(inst, "bin"), filepath.Join(inst, "sa")
	for _, d := range []string{confDir, binDir, sa} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(sa, "token"), c.ServiceAccountToken(t, "nftredir-system", readerAccount))
	writeFile(t, filepath.Join(sa, "ca.crt"), string(c.Config().CAData))
	writeFile(t, filepath.Join(confDir, "10-kcluster.conflist"), string(c.Conflist()))
	writeFile(t, filepath.Join(inst, "entry.json"), `{"type":"nftredir-cni","dataDir":"`+filepath.Join(dir, "cni-data")+`"}`)
	cmd := exec.Command(bin.CNI, "install", "--once", "--kubernetes",
		"--cni-conf-dir", confDir, "--cni-bin-dir", binDir,
		"--kube-token-file", filepath.Join(sa, "token"), "--kube-ca-file", filepath.Join(sa, "ca.crt"), "--kube-server", c.APIServer,
		"--plugin-config", filepath.Join(inst, "entry.json"),
		"--socket", m.daemon.socket, "--timeout", "5s", "--exclude-namespaces", "kube-system",
		"--log-file", m.cniLog, "--log-level", "debug")
	cmd.Env = cleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nftredir-cni install --once --kubernetes: %v\n%s", err, out)
	}
	var list struct {
		Plugins []map[string]any `json:"plugins"`
	}
	raw, err := os.ReadFile(filepath.Join(confDir, "10-kcluster.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &list); err != nil || len(list.Plugins) == 0 {
		t.Fatalf("installed conflist: %v\n%s", err, raw)
	}
	entry := list.Plugins[len(list.Plugins)-1]
	k, _ := entry["kubernetes"].(map[string]any)
	kubeconfig, _ := k["kubeconfig"].(string)
	if entry["type"] != "nftredir-cni" || kubeconfig != filepath.Join(confDir, "nftredir-cni.kubeconfig") || k["modeLabel"] != enrolment.DefaultModeLabel {
		t.Fatalf("installed entry %v", entry)
	}
	if fi, err := os.Stat(kubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %s: %v %v", kubeconfig, fi, err)
	}
	c.WriteConflist(t, entry)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(m.cniLog); err == nil {
				t.Logf("nftredir-cni log:\n%s", b)
			}
		}
	})
	return m, kubeconfig
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestK8sBlastRadius: with nftredird down, only pods that must be
// captured wait for it (docs/blast-radius.md). Real kubelet, containerd
// and CNI; the plugin reads the real kube-apiserver with the installer's
// kubeconfig.
func TestK8sBlastRadius(t *testing.T) {
	m, kubeconfig := startBlastCluster(t)
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	m.CreateNamespace(t, "open", nil)
	m.CreateNamespace(t, "late", nil)

	// The plugin's reading of the API, held to the daemon's rule on the
	// same objects as the real API server returns them.
	t.Run("the plugin's lookup agrees with the daemon's rule", func(t *testing.T) {
		// The API server listens in the node's namespace; the plugin
		// runs there, this test does not.
		lc, err := kubelookup.Load(kubeconfig, kubelookup.WithDialContext(m.DialContext))
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		shapes := map[string]func(*corev1.Pod){
			"shape-plain":   func(*corev1.Pod) {},
			"shape-opt-in":  func(p *corev1.Pod) { p.Labels = map[string]string{meshLabel: meshEnabled} },
			"shape-opt-out": func(p *corev1.Pod) { p.Labels = map[string]string{meshLabel: "none"} },
			"shape-sidecar": func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy", Image: p.Spec.Containers[0].Image})
			},
			"shape-native": func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "istio-proxy", Image: p.Spec.Containers[0].Image}}
			},
			"shape-injected": func(p *corev1.Pod) { p.Annotations = map[string]string{"sidecar.istio.io/status": "{}"} },
		}
		sel := kube.DefaultSelector()
		checked := 0
		for _, nsName := range []string{"mesh", "open"} {
			ns, err := m.Client.CoreV1().Namespaces().Get(t.Context(), nsName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for name, mutate := range shapes {
				// On a node that does not exist: the objects are real, no
				// sandbox is ever made for them.
				p := m.StandinPod(t, nsName, name, 0, "elsewhere", "app")
				mutate(p)
				p = m.CreatePod(t, p)
				want, wantWhy := sel.Captured(p, ns)
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				got, err := lc.Decide(ctx, enrolment.Selector(sel), nsName, name, string(p.UID))
				cancel()
				if err != nil {
					t.Fatalf("%s/%s: %v", nsName, name, err)
				}
				if got.Captured != want || got.Why != wantWhy {
					t.Errorf("%s/%s: plugin decides %v %q, daemon %v %q", nsName, name, got.Captured, got.Why, want, wantWhy)
				}
				checked++
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := lc.Decide(ctx, enrolment.Selector(sel), "open", "no-such-pod", ""); !kubelookup.IsNotFound(err) {
			t.Errorf("absent pod: %v; want the API's 404", err)
		}
		t.Logf("%d pods: the plugin's decision from the real API equals kube.Selector.Captured", checked)
	})

	t.Run("daemon down: only pods that must be captured wait", func(t *testing.T) {
		m.daemon.kill(t)
		down := true
		defer func() {
			if down {
				m.daemon.start(t)
			}
		}()
		killedAt := time.Now()

		open := m.runPod(t, "open", "open-app")
		wantDirect(t, m.answer(t, open), "open-app")
		openTook := time.Since(killedAt)

		// Labelled while the daemon is down, before its pod exists.
		m.label(t, "namespace", "", "late", meshEnabled)
		held := []*corev1.Pod{
			m.createPod(t, "mesh", "mesh-app"),
			m.createPod(t, "open", "pod-labelled", withLabels(map[string]string{meshLabel: meshEnabled})),
			m.createPod(t, "late", "late-app"),
		}
		for _, p := range held {
			m.waitEvent(t, p, "FailedCreatePodSandBox", "the enrolment policy captures it")
		}
		// Several seconds of the kubelet's retries: none of them started.
		time.Sleep(5 * time.Second)
		for _, p := range held {
			got, err := m.Client.CoreV1().Pods(p.Namespace).Get(t.Context(), p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if kcluster.PodReady(got) || got.Status.PodIP != "" {
				t.Fatalf("pod %s/%s started while the daemon was down: ready=%v ip=%q", p.Namespace, p.Name, kcluster.PodReady(got), got.Status.PodIP)
			}
		}
		b, err := os.ReadFile(m.cniLog)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "starting the pod without it") || !strings.Contains(string(b), "neither the pod nor namespace open is labelled") {
			t.Errorf("the CNI log does not say why open-app started without the daemon")
		}

		m.daemon.start(t)
		down = false
		backAt := time.Now()
		for _, p := range held {
			p = m.WaitPodReady(t, p.Namespace, p.Name)
			rec := m.enrolled(t, p.UID)
			if rec == nil {
				t.Fatalf("pod %s/%s Ready but not enrolled", p.Namespace, p.Name)
			}
			m.proxyIn(t, rec)
			wantCaptured(t, m.answer(t, p), p.Name)
		}
		t.Logf("daemon down: open/open-app Ready and answering %s after the kill; mesh/mesh-app, open/pod-labelled, late/late-app (namespace labelled while down) held (FailedCreatePodSandBox), all Ready and captured %s after the daemon came back",
			openTook.Round(time.Millisecond), time.Since(backAt).Round(time.Millisecond))
	})
}
