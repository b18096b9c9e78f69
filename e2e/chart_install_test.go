package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
)

// chartInstall is nftredir installed in a test cluster the way the README
// and docs/deploy.md tell users: make image's image in the node's
// containerd, the namespace at the privileged Pod Security level, and
// `helm install` of charts/nftredir (a DaemonSet: nftredird in Kubernetes
// mode and the CNI install step, in containers).
type chartInstall struct {
	c    *kcluster.Cluster
	Host dsHost
	// Values are the values files helm installed with, in order.
	Values []string
	// Pod is the DaemonSet pod found Ready (restartPod updates it).
	Pod corev1.Pod
	// API is a client of the daemon's socket on the node; it reconnects
	// across restarts of the pod (the socket path stays).
	API *client.Client
	// Took is how long from helm install to the pod Ready.
	Took time.Duration
}

// zdsSocket is the DaemonSet daemon's ZDS socket as the node sees it
// (the chart's NFTREDIR_ZDS_SOCKET, ztunnel's default INPOD_UDS, in
// hostPaths.ztunnelDir): what a ztunnel on the node connects to.
func (h dsHost) zdsSocket() string { return filepath.Join(h.ztunnel, "ztunnel.sock") }

// withProxy is installChart's extra for a test that runs a node proxy on
// the ZDS socket (stock ztunnel, the stand-in): the chart's default, a
// mesh pod's sandbox waiting for the proxy's ack.
var withProxy = map[string]any{"zdsRequireAck": true}

// installChart installs nftredir into c as users do and waits until its
// DaemonSet pod is Ready (serving, startup reconcile done, plugin
// chained) and its API answers. h is the node's side of the chart's host
// paths (newDSHost; make it first when something must know a path, such
// as the ZDS socket, before the install). extra, if not nil, is written
// as a second values file over the test's base values (writeDSValues), so
// helm merges it key by key, e.g. {"uninstall": {"releasePods": false}}.
// The image is built once per test binary (hack/image.sh, as make image)
// and imported into c here, so call it once per cluster.
func installChart(t *testing.T, c *kcluster.Cluster, h dsHost, extra map[string]any) *chartInstall {
	t.Helper()
	img, bin := buildImage(t)
	c.ImportImage(t, img.tarball)
	ci := &chartInstall{c: c, Host: h, Values: []string{writeDSValues(t, c, h)}}
	if extra != nil {
		b, err := json.MarshalIndent(extra, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		// JSON is YAML: helm reads it as a values file.
		path := filepath.Join(t.TempDir(), "values-extra.yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ci.Values = append(ci.Values, path)
	}
	// As docs/deploy.md: the namespace first, at the privileged Pod
	// Security level (hostNetwork, hostPath, capabilities).
	if _, err := c.Client.CoreV1().Namespaces().Get(t.Context(), dsNamespace, metav1.GetOptions{}); err != nil {
		c.CreateNamespace(t, dsNamespace, map[string]string{"pod-security.kubernetes.io/enforce": "privileged"})
	}
	args := []string{"install", dsRelease, filepath.Join(bin.Repo, "charts", "nftredir"), "--namespace", dsNamespace}
	for _, v := range ci.Values {
		args = append(args, "-f", v)
	}
	start := time.Now()
	t.Logf("helm install:\n%s", helm(t, c, args...))
	ci.Pod = waitDSPodReady(t, c)
	ci.Took = time.Since(start)
	api, err := client.Dial(t.Context(), h.socket(), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() })
	ci.API = api
	return ci
}

// restartPod deletes the DaemonSet's pod, as `kubectl delete pod` does,
// and waits until its replacement is Ready; it returns how long that took
// from the delete.
func (ci *chartInstall) restartPod(t *testing.T) time.Duration {
	t.Helper()
	old := ci.Pod.Name
	start := time.Now()
	if err := ci.c.Client.CoreV1().Pods(dsNamespace).Delete(t.Context(), old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ci.Pod = waitDSPodReady(t, ci.c, old)
	return time.Since(start)
}
