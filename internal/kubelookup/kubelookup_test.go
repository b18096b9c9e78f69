package kubelookup_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftredir/nftredir/internal/enrolment"
	"github.com/nftredir/nftredir/internal/kubelookup"
	"github.com/nftredir/nftredir/internal/kubelookup/kubelookuptest"
	"github.com/nftredir/nftredir/kube"
)

func apiPod(name string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func labels(l map[string]string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Labels = l } }

// shapes are pods that the rule tells apart, as API objects.
func shapes() []*corev1.Pod {
	now := metav1.NewTime(time.Now())
	return []*corev1.Pod{
		apiPod("plain"),
		apiPod("opt-in", labels(map[string]string{kube.DefaultModeLabel: "ambient"})),
		apiPod("opt-out", labels(map[string]string{kube.DefaultModeLabel: "none"})),
		apiPod("other-value", labels(map[string]string{kube.DefaultModeLabel: "sidecar"})),
		apiPod("sidecar", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy"})
		}),
		apiPod("native-sidecar", func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "istio-proxy"}} }),
		apiPod("injected", func(p *corev1.Pod) { p.Annotations = map[string]string{"sidecar.istio.io/status": "{}"} }),
		apiPod("host", labels(map[string]string{kube.DefaultModeLabel: "ambient"}), func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		apiPod("deleting", labels(map[string]string{kube.DefaultModeLabel: "ambient"}), func(p *corev1.Pod) {
			p.DeletionTimestamp = &now
			p.Finalizers = []string{"example.com/hold"}
		}),
	}
}

func client(t *testing.T, s *kubelookuptest.Server) *kubelookup.Client {
	t.Helper()
	c, err := kubelookup.Load(s.Kubeconfig(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Decide on the API's JSON agrees with the daemon's rule on the API's
// objects, for every shape of pod, in a labelled and an unlabelled
// namespace.
func TestDecideAgreesWithDaemon(t *testing.T) {
	s := kubelookuptest.Start(t)
	c := client(t, s)
	sel := kube.DefaultSelector()
	for _, nsLabels := range []map[string]string{nil, {kube.DefaultModeLabel: "ambient"}} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: nsLabels}}
		s.AddNamespace(ns)
		for _, p := range shapes() {
			s.AddPod(p)
			want, wantWhy := sel.Captured(p, ns)
			got, err := c.Decide(t.Context(), enrolment.Selector(sel), p.Namespace, p.Name, string(p.UID))
			if err != nil {
				t.Fatalf("%s in %v: %v", p.Name, nsLabels, err)
			}
			if got.Captured != want || got.Why != wantWhy {
				t.Errorf("%s in namespace labelled %v: plugin decides %v %q, daemon %v %q", p.Name, nsLabels, got.Captured, got.Why, want, wantWhy)
			}
		}
	}
}

// A custom selector reaches the decision.
func TestDecideCustomSelector(t *testing.T) {
	s := kubelookuptest.Start(t)
	c := client(t, s)
	s.AddNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"mesh.example/capture": "yes"}}})
	s.AddPod(apiPod("web"))
	sel := enrolment.Selector{Label: "mesh.example/capture", Enabled: "yes", Disabled: "no"}
	if d, err := c.Decide(t.Context(), sel, "shop", "web", "uid-web"); err != nil || !d.Captured {
		t.Errorf("custom selector: %+v %v; want captured", d, err)
	}
	if d, err := c.Decide(t.Context(), enrolment.DefaultSelector(), "shop", "web", "uid-web"); err != nil || d.Captured {
		t.Errorf("default selector on a custom-labelled namespace: %+v %v; want not captured", d, err)
	}
}

// No decision without the pod itself: absent, another pod of that name,
// a refused token, an API that keeps failing. A static pod's mirror
// stands for the pod.
func TestDecideWithoutAnswer(t *testing.T) {
	s := kubelookuptest.Start(t)
	c := client(t, s)
	s.AddNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	s.AddPod(apiPod("web"))
	s.AddPod(apiPod("static", func(p *corev1.Pod) { p.Annotations = map[string]string{"kubernetes.io/config.mirror": "kubelet-uid"} }))
	sel := enrolment.DefaultSelector()

	if _, err := c.Decide(t.Context(), sel, "shop", "missing", ""); !kubelookup.IsNotFound(err) || !strings.Contains(err.Error(), "404") {
		t.Errorf("missing pod: %v; want a 404", err)
	}
	if _, err := c.Decide(t.Context(), sel, "shop", "web", "uid-older"); err == nil || !strings.Contains(err.Error(), "uid-older") {
		t.Errorf("pod of another uid: %v; want an error naming the sandbox's uid", err)
	}
	if d, err := c.Decide(t.Context(), sel, "shop", "static", "kubelet-uid"); err != nil || d.Captured {
		t.Errorf("static pod by its mirror: %+v %v", d, err)
	}

	bad := kubelookup.NewKubeconfig(s.URL(), s.CAPEM(), "revoked").Marshal()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := kubelookup.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if _, err := rc.Decide(t.Context(), sel, "shop", "web", "uid-web"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("revoked token: %v; want a 401", err)
	}
	if d := time.Since(begin); d > time.Second {
		t.Errorf("a refused token was retried for %s; a refusal is final", d)
	}

	s.Fail(http.StatusServiceUnavailable)
	before := s.Calls()
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	if _, err := c.Decide(ctx, sel, "shop", "web", "uid-web"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("failing API: %v; want the 503", err)
	}
	if n := s.Calls() - before; n < 3 {
		t.Errorf("a failing API was asked %d times in 700ms; want retries", n)
	}
}

// An API server that is not there: no decision once the time is up.
func TestDecideUnreachable(t *testing.T) {
	s := kubelookuptest.Start(t)
	p := s.Kubeconfig(t, t.TempDir())
	c, err := kubelookup.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Decide(ctx, enrolment.DefaultSelector(), "shop", "web", ""); err == nil {
		t.Error("decided with the API server gone")
	}
}

func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"yaml":      "apiVersion: v1\nkind: Config\n",
		"no-ctx":    `{"clusters":[],"users":[],"contexts":[],"current-context":"x"}`,
		"http":      string(kubelookup.NewKubeconfig("http://127.0.0.1:1", []byte("x"), "t").Marshal()),
		"no-ca-pem": string(kubelookup.NewKubeconfig("https://127.0.0.1:1", []byte("not pem"), "t").Marshal()),
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := kubelookup.Load(p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	if _, err := kubelookup.Load(filepath.Join(dir, "absent")); err == nil {
		t.Error("absent kubeconfig loaded")
	}
}
