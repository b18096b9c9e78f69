package install

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/kubelookup"
	"github.com/nftredir/nftredir/internal/kubelookup/kubelookuptest"
)

// The installer writes a kubeconfig the plugin's lookup can use, 0600,
// follows the token when the kubelet rotates it, and removes it on
// uninstall.
func TestKubeconfigWrittenAndRotated(t *testing.T) {
	api := kubelookuptest.Start(t)
	api.AddNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}})
	n := newNode(t)
	n.fixture(t, "1.0.0.conflist", "10-net.conflist")
	sa := t.TempDir()
	token, ca := filepath.Join(sa, "token"), filepath.Join(sa, "ca.crt")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(token, "stale-token\n")
	write(ca, string(api.CAPEM()))
	cfg := n.config()
	cfg.Kubeconfig = &Kubeconfig{Path: filepath.Join(n.conf, DefaultKubeconfigName), TokenFile: token, CAFile: ca, Server: api.URL()}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	labels := func() (map[string]string, error) {
		c, err := kubelookup.Load(cfg.Kubeconfig.Path)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.NamespaceLabels(t.Context(), "shop")
	}

	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(cfg.Kubeconfig.Path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %v mode %v; want 0600", err, fi)
	}
	if _, err := labels(); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("with the stale token: %v; want 401", err)
	}
	// The kubelet swaps the projected token; the next sync follows.
	write(token, kubelookuptest.Token+"\n")
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if l, err := labels(); err != nil || l["istio.io/dataplane-mode"] != "ambient" {
		t.Fatalf("after rotation: %v %v", l, err)
	}
	if err := Check(cfg); err != nil {
		t.Errorf("Check: %v", err)
	}
	// Unchanged: not rewritten.
	before, _ := os.Stat(cfg.Kubeconfig.Path)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(cfg.Kubeconfig.Path); !os.SameFile(before, after) {
		t.Error("an unchanged kubeconfig was rewritten")
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.Kubeconfig.Path); !os.IsNotExist(err) {
		t.Errorf("kubeconfig left after uninstall: %v", err)
	}
}

// A kubeconfig that cannot be written leaves the installer not ready but
// still chains the plugin: without the kubeconfig it only waits for the
// daemon, as in standalone mode.
func TestKubeconfigMissingTokenStillChains(t *testing.T) {
	n := newNode(t)
	list := n.fixture(t, "1.0.0.conflist", "10-net.conflist")
	cfg := n.config()
	cfg.Kubeconfig = &Kubeconfig{Path: filepath.Join(n.conf, DefaultKubeconfigName), TokenFile: "/nonexistent/token", CAFile: "/nonexistent/ca", Server: "https://127.0.0.1:6443"}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Sync(); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("Sync: %v; want the token's error", err)
	}
	if in.Ready() {
		t.Error("ready without the kubeconfig")
	}
	if got := types(readList(t, list)); got[len(got)-1] != PluginType {
		t.Errorf("plugin not chained: %v", got)
	}
}

// Kubernetes mode and the policy come from nftredird's own variables,
// and the entry names the kubeconfig as the host sees it.
func TestParseKubernetesFromDaemonEnv(t *testing.T) {
	_, cfg, err := parse(CmdInstall, []string{"--cni-conf-dir", "/host/etc/cni/net.d"}, envMap(map[string]string{
		"NFTREDIR_KUBERNETES":              "true",
		"NFTREDIR_DATAPLANE_MODE_LABEL":    "mesh.example/capture",
		"NFTREDIR_DATAPLANE_MODE_ENABLED":  "yes",
		"NFTREDIR_DATAPLANE_MODE_DISABLED": "no",
		"NFTREDIR_CNI_CONF_DIR_ON_HOST":    "/etc/cni/net.d",
		"KUBERNETES_SERVICE_HOST":          "10.96.0.1",
		"KUBERNETES_SERVICE_PORT":          "443",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"kubeconfig": "/etc/cni/net.d/nftredir-cni.kubeconfig", "modeLabel": "mesh.example/capture", "modeEnabled": "yes", "modeDisabled": "no"}
	if e := entryOf(t, cfg); !jsonEqual(e["kubernetes"], want) {
		t.Errorf("entry kubernetes %v, want %v", e["kubernetes"], want)
	}
	k := cfg.Kubeconfig
	if k == nil || k.Path != "/host/etc/cni/net.d/nftredir-cni.kubeconfig" || k.Server != "https://10.96.0.1:443" || k.TokenFile != DefaultTokenFile || k.CAFile != DefaultCAFile {
		t.Errorf("kubeconfig source %+v", k)
	}
	// The installer's own prefix does not turn it on: one setting, the
	// daemon's.
	if _, cfg, err := parse(CmdInstall, nil, envMap(map[string]string{"NFTREDIR_CNI_KUBERNETES": "true"}), io.Discard); err != nil || cfg.Kubeconfig != nil {
		t.Errorf("NFTREDIR_CNI_KUBERNETES turned Kubernetes mode on: %+v %v", cfg.Kubeconfig, err)
	}
	// Standalone: no key, no kubeconfig.
	if _, cfg, err := parse(CmdInstall, nil, noEnv, io.Discard); err != nil || cfg.Kubeconfig != nil || entryOf(t, cfg)["kubernetes"] != nil {
		t.Errorf("standalone: %+v %v", cfg.Kubeconfig, err)
	}
	// A --plugin-config file's lookupTimeout stays; its policy does not,
	// and without Kubernetes mode its key goes.
	file := filepath.Join(t.TempDir(), "entry.json")
	if err := os.WriteFile(file, []byte(`{"type":"nftredir-cni","kubernetes":{"lookupTimeout":"2s","modeLabel":"stale"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, cfg, err = parse(CmdInstall, []string{"--plugin-config", file, "--kubernetes", "--kube-server", "https://10.0.0.1:6443"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := entryOf(t, cfg)["kubernetes"].(map[string]any); k["lookupTimeout"] != "2s" || k["modeLabel"] != "istio.io/dataplane-mode" {
		t.Errorf("entry kubernetes from a plugin-config file: %v", k)
	}
	if _, cfg, err := parse(CmdInstall, []string{"--plugin-config", file}, noEnv, io.Discard); err != nil || entryOf(t, cfg)["kubernetes"] != nil {
		t.Errorf("standalone with a plugin-config file's kubernetes key: %v %v", entryOf(t, cfg)["kubernetes"], err)
	}
	// Outside a pod, without --kube-server: refused.
	if _, _, err := parse(CmdInstall, []string{"--kubernetes"}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("no server: %v", err)
	}
}
