package plugin

import (
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftredir/nftredir/internal/kubelookup/kubelookuptest"
)

// kubeEnv is env with the stand-in API holding namespace shop (labelled
// nsLabels) and pod shop/cart-0 (uid-1, podLabels), and the entry's
// kubernetes key pointing at it.
type kubeEnv struct {
	*env
	api  *kubelookuptest.Server
	kube map[string]any
}

func newKubeEnv(t *testing.T, nsLabels, podLabels map[string]string) *kubeEnv {
	t.Helper()
	e := &kubeEnv{env: newEnv(t), api: kubelookuptest.Start(t)}
	e.p.Helper = helperBinary(t)
	e.api.AddNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: nsLabels}})
	e.api.AddPod(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-0", UID: types.UID("uid-1"), Labels: podLabels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
	})
	e.kube = map[string]any{"kubeconfig": e.api.Kubeconfig(t, t.TempDir()), "lookupTimeout": "500ms"}
	return e
}

func (e *kubeEnv) addArgs(t *testing.T) []byte {
	return e.conf(t, "1.0.0", prevResults["1.0.0"], map[string]any{"kubernetes": e.kube})
}

var ambient = map[string]string{"istio.io/dataplane-mode": "ambient"}

// With the daemon down, a pod the policy would not capture starts: the
// previous result is printed as it would be with the daemon.
func TestCNIAddWithoutDaemonPassesUncapturedPod(t *testing.T) {
	e := newKubeEnv(t, nil, nil)
	e.stop(t)
	e.add(t, args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1))
	if diff := cmp.Diff(jsonValue(t, prevResults["1.0.0"]), jsonValue(t, e.stdout.String())); diff != "" {
		t.Errorf("printed result differs from prevResult (-prev +printed):\n%s", diff)
	}
	log := e.stderr.String()
	if !strings.Contains(log, "does not capture it") || !strings.Contains(log, "neither the pod nor namespace shop is labelled istio.io/dataplane-mode=ambient") {
		t.Errorf("log does not say why the pod started without the daemon:\n%s", log)
	}
	if e.api.Calls() != 2 {
		t.Errorf("%d API calls; want 2 (the pod, its namespace)", e.api.Calls())
	}
}

// With the daemon down, a pod that must be captured, by its namespace or
// its own label, fails as it does without the key (code 11), saying why.
func TestCNIAddWithoutDaemonHoldsCapturedPod(t *testing.T) {
	for name, labels := range map[string][2]map[string]string{
		"namespace labelled": {ambient, nil},
		"pod labelled":       {nil, ambient},
	} {
		t.Run(name, func(t *testing.T) {
			e := newKubeEnv(t, labels[0], labels[1])
			e.stop(t)
			ce := asCNI(t, e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1)))
			if ce.Code != 11 || !strings.Contains(ce.Msg, "does not exist") || !strings.Contains(ce.Msg, "the enrolment policy captures it") {
				t.Errorf("got %d %q; want code 11 naming the missing socket and the policy", ce.Code, ce.Msg)
			}
			e.assertNothingDone(t)
		})
	}
}

// With the daemon down and no answer from the API either, the pod waits:
// nothing is guessed.
func TestCNIAddWithoutDaemonOrAPIHoldsEveryPod(t *testing.T) {
	t.Run("API failing", func(t *testing.T) {
		e := newKubeEnv(t, nil, nil)
		e.stop(t)
		e.api.Fail(http.StatusServiceUnavailable)
		ce := asCNI(t, e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1)))
		if ce.Code != 11 || !strings.Contains(ce.Msg, "could not be read from the Kubernetes API") || !strings.Contains(ce.Msg, "503") {
			t.Errorf("got %d %q", ce.Code, ce.Msg)
		}
		e.assertNothingDone(t)
	})
	t.Run("kubeconfig missing", func(t *testing.T) {
		e := newKubeEnv(t, nil, nil)
		e.stop(t)
		e.kube["kubeconfig"] = "/nonexistent/kubeconfig"
		ce := asCNI(t, e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1)))
		if ce.Code != 11 || !strings.Contains(ce.Msg, "/nonexistent/kubeconfig") {
			t.Errorf("got %d %q", ce.Code, ce.Msg)
		}
		e.assertNothingDone(t)
	})
	t.Run("helper missing", func(t *testing.T) {
		e := newKubeEnv(t, nil, nil)
		e.stop(t)
		e.p.Helper = filepath.Join(t.TempDir(), "nftredir-cni-helper")
		ce := asCNI(t, e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1)))
		if ce.Code != 11 || !strings.Contains(ce.Msg, "nftredir-cni-helper") || !strings.Contains(ce.Msg, "no such file") || e.api.Calls() != 0 {
			t.Errorf("got %d %q after %d API calls; want code 11 naming the missing helper", ce.Code, ce.Msg, e.api.Calls())
		}
		e.assertNothingDone(t)
	})
	t.Run("pod not in the API", func(t *testing.T) {
		e := newKubeEnv(t, nil, nil)
		e.stop(t)
		other := "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=gone;K8S_POD_UID=uid-1"
		ce := asCNI(t, e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", other)))
		if ce.Code != 11 || !strings.Contains(ce.Msg, "404") {
			t.Errorf("got %d %q", ce.Code, ce.Msg)
		}
	})
	t.Run("no Kubernetes pod", func(t *testing.T) {
		e := newKubeEnv(t, nil, nil)
		e.stop(t)
		ce := asCNI(t, e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", "")))
		if ce.Code != 11 || !strings.Contains(ce.Msg, "K8S_POD_NAMESPACE") || e.api.Calls() != 0 {
			t.Errorf("got %d %q after %d API calls", ce.Code, ce.Msg, e.api.Calls())
		}
	})
}

// The plugin decides only when the daemon cannot answer: an answer,
// including a refusal, is the daemon's, and the API is not asked.
func TestCNIAddDaemonDecidesWhenItAnswers(t *testing.T) {
	t.Run("enrols", func(t *testing.T) {
		e := newKubeEnv(t, nil, nil)
		e.add(t, args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1))
		if e.fake.Pod("uid-1") == nil || e.api.Calls() != 0 {
			t.Errorf("enrolled %v, API calls %d; want the daemon's enrolment and no API call", e.fake.Pod("uid-1") != nil, e.api.Calls())
		}
	})
	for _, c := range []struct {
		code codes.Code
		cni  uint
		api  bool
	}{
		{codes.InvalidArgument, 7, false},
		{codes.FailedPrecondition, 8, false},
		{codes.Internal, 999, false},
		{codes.Unavailable, 0, true},
		{codes.ResourceExhausted, 0, true},
	} {
		t.Run(c.code.String(), func(t *testing.T) {
			e := newKubeEnv(t, nil, nil)
			e.fake.Fail("AddPod", slices.Repeat([]error{status.Error(c.code, "the daemon says no")}, 10)...)
			err := e.p.Add(args(e.addArgs(t), "ctr1", "/run/netns/pod1", k8sArgs1))
			if c.api {
				if err != nil || e.api.Calls() == 0 {
					t.Errorf("%v after %d API calls; want the plugin's own decision (uncaptured pod passes)", err, e.api.Calls())
				}
				return
			}
			if ce := asCNI(t, err); ce.Code != c.cni || e.api.Calls() != 0 {
				t.Errorf("got %d %q after %d API calls; want %d and none", ce.Code, ce.Msg, e.api.Calls(), c.cni)
			}
		})
	}
}

func TestParseKube(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		kube any
		want string // substring of the error; empty: valid
	}{
		{"minimal", map[string]any{"kubeconfig": "/etc/cni/net.d/k"}, ""},
		{"custom", map[string]any{"kubeconfig": "/k", "modeLabel": "m", "modeEnabled": "on", "modeDisabled": "", "lookupTimeout": "2s"}, ""},
		{"relative", map[string]any{"kubeconfig": "k"}, "absolute"},
		{"no kubeconfig", map[string]any{}, "absolute"},
		{"misspelt", map[string]any{"kubeconfig": "/k", "modeLable": "x"}, "unknown field"},
		{"bad selector", map[string]any{"kubeconfig": "/k", "modeEnabled": "x", "modeDisabled": "x"}, "both"},
		{"bad timeout", map[string]any{"kubeconfig": "/k", "lookupTimeout": "-1s"}, "lookupTimeout"},
		{"not an object", "yes", "kubernetes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := ParseConf(e.conf(t, "1.0.0", "", map[string]any{"kubernetes": tc.kube}), true)
			if tc.want == "" {
				if err != nil || c.Kube == nil {
					t.Fatalf("%v %+v", err, c)
				}
				return
			}
			if ce := asCNI(t, err); ce.Code != 7 || !strings.Contains(ce.Msg, tc.want) {
				t.Errorf("got %d %q; want code 7 with %q", ce.Code, ce.Msg, tc.want)
			}
		})
	}
	c, _, err := ParseConf(e.conf(t, "1.0.0", "", map[string]any{"kubernetes": map[string]any{"kubeconfig": "/k", "modeLabel": "m", "modeEnabled": "on", "modeDisabled": ""}}), true)
	if err != nil || c.Kube.Selector.Label != "m" || c.Kube.Selector.Enabled != "on" || c.Kube.Selector.Disabled != "" || c.Kube.LookupTimeout != DefaultLookupTimeout {
		t.Errorf("custom selector parsed as %+v (%v)", c.Kube, err)
	}
	if c, _, err := ParseConf(e.conf(t, "1.0.0", "", nil), true); err != nil || c.Kube != nil {
		t.Errorf("no kubernetes key: %+v %v; want standalone (nil)", c.Kube, err)
	}
}
