package install

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
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

// tokenAPI answers TokenRequest as the API server does (the
// authentication.k8s.io/v1 types, 201 Created), for tokens of
// reader/plugin asked with the bearer own. e2e TestK8sNodeScope holds the
// installer to the real kube-apiserver.
type tokenAPI struct {
	srv *httptest.Server
	mu  sync.Mutex // protects the fields below
	// life is the life of each token issued.
	life time.Duration
	// fail, when not 0, is the status every request gets.
	fail   int
	asked  []authenticationv1.TokenRequest
	issued int
}

func startTokenAPI(t *testing.T) *tokenAPI {
	a := &tokenAPI{life: time.Hour}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		status := func(code int, msg string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Message: msg, Code: int32(code)})
		}
		switch {
		case a.fail != 0:
			status(a.fail, "the API is failing")
			return
		case r.Header.Get("Authorization") != "Bearer own-token":
			status(http.StatusUnauthorized, "Unauthorized")
			return
		case r.Method != http.MethodPost || r.URL.Path != "/api/v1/namespaces/nftredir-system/serviceaccounts/nftredir-cni/token":
			status(http.StatusNotFound, r.Method+" "+r.URL.Path+" not found")
			return
		}
		var tr authenticationv1.TokenRequest
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			status(http.StatusBadRequest, err.Error())
			return
		}
		a.asked = append(a.asked, tr)
		a.issued++
		tr.Status = authenticationv1.TokenRequestStatus{
			Token:               fmt.Sprintf("reader-token-%d", a.issued),
			ExpirationTimestamp: metav1.NewTime(time.Now().Add(a.life)),
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(tr)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *tokenAPI) set(f func(a *tokenAPI)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

func (a *tokenAPI) requests() []authenticationv1.TokenRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asked)
}

// With a reader account the kubeconfig carries that account's token,
// asked for with the pod's own, for an hour; it is renewed at 80% of its
// life and not before, a failed renewal keeps a token that is still
// valid, and without one the installer is not ready.
func TestKubeconfigReaderToken(t *testing.T) {
	api := startTokenAPI(t)
	n := newNode(t)
	n.fixture(t, "1.0.0.conflist", "10-net.conflist")
	sa := t.TempDir()
	token, ca := filepath.Join(sa, "token"), filepath.Join(sa, "ca.crt")
	if err := os.WriteFile(token, []byte("own-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.srv.Certificate().Raw})
	if err := os.WriteFile(ca, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := n.config()
	cfg.Kubeconfig = &Kubeconfig{Path: filepath.Join(n.conf, DefaultKubeconfigName), TokenFile: token, CAFile: ca, Server: api.srv.URL,
		Reader: &ReaderToken{Namespace: "nftredir-system", Account: "nftredir-cni"}}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	carried := func() string {
		t.Helper()
		raw, err := os.ReadFile(cfg.Kubeconfig.Path)
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Users []struct {
				User struct {
					Token string `json:"token"`
				} `json:"user"`
			} `json:"users"`
		}
		if err := json.Unmarshal(raw, &k); err != nil || len(k.Users) != 1 {
			t.Fatalf("kubeconfig %v:\n%s", err, raw)
		}
		return k.Users[0].User.Token
	}

	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := carried(); got != "reader-token-1" {
		t.Fatalf("kubeconfig carries %q; want the reader's token", got)
	}
	if fi, err := os.Stat(cfg.Kubeconfig.Path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %v mode %v; want 0600", err, fi)
	}
	asked := api.requests()
	if len(asked) != 1 {
		t.Fatalf("%d TokenRequests; want 1", len(asked))
	}
	if spec := asked[0].Spec; spec.ExpirationSeconds == nil || *spec.ExpirationSeconds != 3600 || spec.BoundObjectRef != nil || len(spec.Audiences) != 0 {
		t.Errorf("TokenRequest spec %+v; want an hour, for the API server's audience", spec)
	}
	if d := in.untilRenewal(); d < 47*time.Minute || d > 48*time.Minute {
		t.Errorf("renewal in %s; want at 80%% of the hour", d)
	}

	// Before its renewal time: no request, nothing rewritten.
	before, _ := os.Stat(cfg.Kubeconfig.Path)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(cfg.Kubeconfig.Path); !os.SameFile(before, after) || len(api.requests()) != 1 {
		t.Errorf("a sync before the renewal time asked again (%d requests) or rewrote the file", len(api.requests()))
	}

	// Past it: a new token, written.
	api.set(func(a *tokenAPI) { a.life = 2 * time.Second })
	in.readerToken.renewAt = time.Now()
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := carried(); got != "reader-token-2" {
		t.Fatalf("after the renewal time the kubeconfig carries %q; want a new token", got)
	}
	// A 2s token is renewed after 1.6s; Run waits no longer than that.
	if d := in.untilRenewal(); d > 1600*time.Millisecond {
		t.Errorf("renewal of a 2s token in %s", d)
	}

	// The API failing at the renewal: a valid token stays.
	api.set(func(a *tokenAPI) { a.fail = http.StatusServiceUnavailable; a.life = time.Hour })
	in.readerToken = &issuedToken{token: "still-valid", renewAt: time.Now(), expires: time.Now().Add(10 * time.Minute)}
	if err := in.Sync(); err != nil {
		t.Fatalf("a failed renewal with a valid token: %v", err)
	}
	if got := carried(); got != "still-valid" || !in.Ready() {
		t.Errorf("kubeconfig carries %q, ready %v; want the still valid token, ready", got, in.Ready())
	}
	// ... and none left: the installer says why and is not ready.
	in.readerToken.expires = time.Now().Add(30 * time.Second)
	if err := in.Sync(); err == nil || !strings.Contains(err.Error(), "nftredir-system/nftredir-cni") || !strings.Contains(err.Error(), "the API is failing") || in.Ready() {
		t.Errorf("Sync with the API failing and the token about to expire: %v, ready %v; want the API's answer, not ready", err, in.Ready())
	}
	// The API back: renewed.
	api.set(func(a *tokenAPI) { a.fail = 0 })
	if err := in.Sync(); err != nil || carried() != "reader-token-3" || !in.Ready() {
		t.Errorf("the API back: %v, token %q, ready %v", err, carried(), in.Ready())
	}
}

// The read-only account comes from the chart's variable, in the pod's
// namespace, which the Downward API names; it needs one.
func TestParseReaderAccount(t *testing.T) {
	env := map[string]string{
		"NFTREDIR_KUBERNETES":              "true",
		"NFTREDIR_CNI_KUBE_READER_ACCOUNT": "nftredir-cni",
		"KUBERNETES_SERVICE_HOST":          "10.96.0.1",
		"KUBERNETES_SERVICE_PORT":          "443",
		"POD_NAME":                         "nftredir-x1",
		"POD_NAMESPACE":                    "nftredir-system",
	}
	_, cfg, err := parse(CmdInstall, nil, envMap(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := ReaderToken{Namespace: "nftredir-system", Account: "nftredir-cni"}
	if cfg.Kubeconfig == nil || cfg.Kubeconfig.Reader == nil || *cfg.Kubeconfig.Reader != want {
		t.Fatalf("kubeconfig %+v; want reader %+v", cfg.Kubeconfig, want)
	}
	delete(env, "POD_NAME")
	delete(env, "POD_NAMESPACE")
	if _, _, err := parse(CmdInstall, nil, envMap(env), io.Discard); err == nil || !strings.Contains(err.Error(), "--pod-namespace") {
		t.Errorf("a reader account without the pod's namespace: %v; want --pod-namespace named", err)
	}
}
