package nri_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/calltrace"
	"github.com/nftredir/nftredir/internal/testkit/syncbuf"
	"github.com/nftredir/nftredir/nri"
)

// badAnnotation makes a mesh pod one the daemon refuses to capture: an
// option annotation it does not know.
var badAnnotation = map[string]string{"nftredir.io/capture-mood": "tproxy"}

// wantRejected checks that the runtime's validator refuses a container of
// pod: the plugin is not registered.
func wantRejected(t *testing.T, rt *runtime, pod string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), `required plugin "nftredir" not present`) {
		t.Fatalf("creating a container of %s: %v; want the validator's refusal while nftredir is not registered", pod, err)
	}
}

// With no plugin connected the runtime's validator holds every container
// back: the gate NRI enrolment stands on.
func TestValidatorHoldsContainersWithoutPlugin(t *testing.T) {
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	pod := sandbox("mesh", "web", "10.1.0.5")
	if err := rt.runPodSandbox(pod); err != nil {
		t.Fatalf("RunPodSandbox without a plugin: %v", err)
	}
	wantRejected(t, rt, "mesh/web", rt.createContainer(pod, "app"))
}

// Synchronize captures the mesh pods the runtime started while the plugin
// was away, leaves the others alone, and only then does the runtime
// count the plugin as registered and let their containers be created.
func TestSynchronizeCapturesPodsStartedWhileAway(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil), apiPod("plain", "db", nil), apiPod("mesh", "running", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	web, db, running := sandbox("mesh", "web", "10.1.0.5"), sandbox("plain", "db", "10.1.0.6"), sandbox("mesh", "running", "10.1.0.7")
	host := sandbox("mesh", "host")
	host.Linux.Namespaces = host.Linux.Namespaces[:1] // host network: no namespace of its own
	for _, p := range []*api.PodSandbox{web, db, host} {
		if err := rt.runPodSandbox(p); err != nil {
			t.Fatal(err)
		}
	}
	rt.hold(running, "app")
	wantRejected(t, rt, "mesh/web", rt.createContainer(web, "app"))

	if err := d.connect(t, rt, nil); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	if got, want := d.enrolled(t, web), nri.NetnsPath(web); got != want {
		t.Errorf("mesh/web enrolled through %q; want %q", got, want)
	}
	if got, want := d.enrolled(t, running), nri.NetnsPath(running); got != want {
		t.Errorf("mesh/running enrolled through %q; want %q", got, want)
	}
	if got := d.enrolled(t, db); got != "" {
		t.Errorf("plain/db enrolled through %q; the policy leaves it alone", got)
	}
	if s := d.plugin.State(); !s.Registered || s.Gate == nil || !s.Gate.Validator {
		t.Errorf("state %+v; want registered with a validator", s)
	}
	for _, p := range []*api.PodSandbox{web, db} {
		if err := rt.createContainer(p, "app"); err != nil {
			t.Errorf("creating a container of %s/%s once registered: %v", p.Namespace, p.Name, err)
		}
	}
}

// RunPodSandbox enrols a mesh pod before its sandbox is ready, answers a
// pod the policy leaves alone with nil, and fails the sandbox of a mesh
// pod it cannot capture, saying why.
func TestRunPodSandbox(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil), apiPod("plain", "db", nil), apiPod("mesh", "bad", badAnnotation))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	if err := d.connect(t, rt, nil); err != nil {
		t.Fatal(err)
	}
	web, db, bad := sandbox("mesh", "web", "10.1.0.5"), sandbox("plain", "db"), sandbox("mesh", "bad")
	if err := rt.runPodSandbox(web); err != nil {
		t.Fatalf("RunPodSandbox of a mesh pod: %v", err)
	}
	if got := d.enrolled(t, web); got != nri.NetnsPath(web) {
		t.Errorf("mesh/web enrolled through %q after its RunPodSandbox", got)
	}
	if rs, _ := d.engine.Table(nri.NetnsPath(web)); rs == nil {
		t.Error("mesh/web has no table in its namespace")
	}
	if err := rt.runPodSandbox(db); err != nil {
		t.Fatalf("RunPodSandbox of a pod outside the mesh: %v", err)
	}
	if got := d.enrolled(t, db); got != "" {
		t.Errorf("plain/db enrolled through %q", got)
	}
	err := rt.runPodSandbox(bad)
	if err == nil || !strings.Contains(err.Error(), "nftredir.io/capture-mood") || !strings.Contains(err.Error(), "mesh/bad") {
		t.Fatalf("RunPodSandbox of a mesh pod with a bad annotation: %v; want the sandbox failed, naming the pod and the annotation", err)
	}
	if got := d.enrolled(t, bad); got != "" {
		t.Errorf("mesh/bad enrolled through %q", got)
	}
	if rs, _ := d.engine.Table(nri.NetnsPath(bad)); rs != nil {
		t.Error("mesh/bad's namespace got a table although its AddPod was refused")
	}
	if s := d.plugin.State(); !s.Registered {
		t.Errorf("a refused pod disconnected the plugin: %+v", s)
	}
}

// A pod enrolled through the sandbox's namespace already (a CNI ADD of
// the same sandbox, when both doors are open) is not enrolled again.
func TestRunPodSandboxAfterCNIAdd(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	if err := d.connect(t, rt, nil); err != nil {
		t.Fatal(err)
	}
	web := sandbox("mesh", "web", "10.1.0.5")
	req, _ := nri.AddPodRequest(web)
	if _, err := d.pods.AddPod(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	applies := d.engine.Calls("Apply")
	if err := rt.runPodSandbox(web); err != nil {
		t.Fatal(err)
	}
	if n := d.engine.Calls("Apply") - applies; n != 0 {
		t.Errorf("RunPodSandbox after the CNI ADD applied the table %d more times", n)
	}
}

// StopPodSandbox releases the pod as a CNI DEL would, unless a newer
// sandbox of the pod enrolled it since.
func TestStopPodSandboxReleases(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	if err := d.connect(t, rt, nil); err != nil {
		t.Fatal(err)
	}
	old := sandbox("mesh", "web", "10.1.0.5")
	if err := rt.runPodSandbox(old); err != nil {
		t.Fatal(err)
	}
	// The kubelet's next sandbox of the same pod, before the old one is
	// stopped.
	newer := sandbox("mesh", "web", "10.1.0.9")
	newer.Id = "sb-mesh-web-2"
	newer.Linux.Namespaces[1].Path = "/var/run/netns/cni-mesh-web-2"
	d.engine.AddNamespace(nri.NetnsPath(newer))
	if err := rt.runPodSandbox(newer); err != nil {
		t.Fatal(err)
	}
	if err := rt.stopPodSandbox(old); err != nil {
		t.Fatalf("StopPodSandbox of the old sandbox: %v", err)
	}
	if got := d.enrolled(t, newer); got != nri.NetnsPath(newer) {
		t.Fatalf("the old sandbox's stop released the newer one's capture: enrolled through %q", got)
	}
	if err := rt.stopPodSandbox(newer); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if got := d.enrolled(t, newer); got != "" {
		t.Errorf("still enrolled through %q after StopPodSandbox", got)
	}
	// The runtime removes the namespace, then the sandbox: nothing left.
	newer.Linux.Namespaces = newer.Linux.Namespaces[:1]
	if err := rt.removePodSandbox(newer); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
}

// A mesh pod listed at Synchronize that cannot be captured and has no
// container yet keeps the plugin unregistered: registering would let the
// validator start its containers uncaptured. The plugin tries again, and
// registers once the pod can be captured. A running pod that cannot be
// captured does not hold the node.
func TestSynchronizeHoldsRefusedPendingPod(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "bad", badAnnotation), apiPod("mesh", "oldbad", badAnnotation), apiPod("plain", "db", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	bad, oldbad, db := sandbox("mesh", "bad"), sandbox("mesh", "oldbad"), sandbox("plain", "db")
	rt.hold(bad)
	rt.hold(oldbad, "app")
	rt.hold(db)

	err := d.connect(t, rt, nil)
	if err == nil || !strings.Contains(err.Error(), "closed") && !strings.Contains(err.Error(), "failed") {
		t.Fatalf("first connection: %v; want it to fail with Synchronize", err)
	}
	if s := d.plugin.State(); s.Registered {
		t.Fatalf("registered although mesh/bad cannot be captured: %+v", s)
	}
	wantRejected(t, rt, "plain/db", rt.createContainer(db, "app"))
	wantRejected(t, rt, "mesh/bad", rt.createContainer(bad, "app"))

	// The pod's owner fixes it: the next connection captures it.
	p, err := d.api.CoreV1().Pods("mesh").Get(context.Background(), "bad", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = nil
	if _, err := d.api.CoreV1().Pods("mesh").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.waitState(t, "registered", func(s nri.State) bool { return s.Registered })
	if got := d.enrolled(t, bad); got != nri.NetnsPath(bad) {
		t.Errorf("mesh/bad enrolled through %q once fixed", got)
	}
	if got := d.enrolled(t, oldbad); got != "" {
		t.Errorf("mesh/oldbad enrolled through %q; its annotation is still bad", got)
	}
	for _, p := range []*api.PodSandbox{bad, db} {
		if err := rt.createContainer(p, "app"); err != nil {
			t.Errorf("creating a container of %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
}

// On a runtime whose NRI has no validator the plugin refuses to register:
// NRI enrolment would be fail-open there.
func TestRefusesFailOpenRuntime(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil))
	rt := startRuntime(t, "containerd", "v2.1.4", "")
	err := d.connect(t, rt, nil)
	if err == nil {
		t.Fatal("registered with containerd v2.1.4")
	}
	s := d.plugin.State()
	if s.Registered || !strings.Contains(s.Refused, "containerd v2.1.4 has no NRI validator") {
		t.Fatalf("state %+v; want refused, naming the runtime", s)
	}
}

// When the runtime restarts, the plugin connects again, and Synchronize
// captures what started in between.
func TestReconnectsAfterRuntimeRestart(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil), apiPod("mesh", "late", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	proxy := newProxy(t, rt.socket)
	if err := d.connect(t, &runtime{socket: proxy.path}, nil); err != nil {
		t.Fatal(err)
	}
	web := sandbox("mesh", "web", "10.1.0.5")
	if err := rt.runPodSandbox(web); err != nil {
		t.Fatal(err)
	}
	// The runtime exits; a new one starts, holding the pod it had.
	rt.r.Stop()
	rt2 := startRuntime(t, "containerd", "v2.4.2", "", web)
	proxy.drop(rt2.socket)
	d.waitState(t, "disconnected", func(s nri.State) bool { return !s.Registered })

	late := sandbox("mesh", "late", "10.1.0.8")
	if err := rt2.runPodSandbox(late); err != nil {
		t.Fatal(err)
	}
	// Whether the plugin was back before the sandbox (its RunPodSandbox)
	// or after (its Synchronize), the pod is captured before any of its
	// containers can be created.
	start := time.Now()
	d.waitState(t, "registered again", func(s nri.State) bool { return s.Registered })
	t.Logf("registered again %v after the runtime came back", time.Since(start).Round(time.Millisecond))
	if got := d.enrolled(t, late); got != nri.NetnsPath(late) {
		t.Errorf("mesh/late enrolled through %q after the reconnection", got)
	}
	if err := rt2.createContainer(late, "app"); err != nil {
		t.Errorf("creating mesh/late's container after the reconnection: %v", err)
	}
}

// Each RunPodSandbox is logged at info with its time in the handler and
// its phases, the lifecycle's among them, as the gRPC server logs an
// AddPod: a pod's start is read from these lines (make bench).
func TestRunPodSandboxLogsPhases(t *testing.T) {
	d := startDaemon(t, apiPod("mesh", "web", nil), apiPod("plain", "db", nil))
	rt := startRuntime(t, "containerd", "v2.4.2", "")
	var out syncbuf.Buffer
	if err := d.connect(t, rt, func(c *nri.Config) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "nri", Level: hclog.Info, Output: &out, JSONFormat: true})
	}); err != nil {
		t.Fatal(err)
	}
	web, db := sandbox("mesh", "web", "10.1.0.5"), sandbox("plain", "db", "10.1.0.6")
	for _, p := range []*api.PodSandbox{web, db} {
		if err := rt.runPodSandbox(p); err != nil {
			t.Fatal(err)
		}
	}
	lines := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m[nri.EventField] == "RunPodSandbox" {
			lines[m["name"].(string)] = m
		}
	}
	for _, c := range []struct {
		pod      string
		captured bool
		phases   []string
	}{
		{"web", true, []string{"enrolled", "lock", "open", "pod_lookup", "namespace_lookup", "admit", "record", "kernel", "policy_added"}},
		{"db", false, []string{"enrolled", "lock", "open", "pod_lookup", "namespace_lookup", "admit", "policy_added"}},
	} {
		l := lines[c.pod]
		if l == nil {
			t.Errorf("no RunPodSandbox line for %s at info in %s", c.pod, out.String())
			continue
		}
		if l["@level"] != "info" || l["captured"] != c.captured {
			t.Errorf("%s: level %v captured %v; want info, %v", c.pod, l["@level"], l["captured"], c.captured)
		}
		total, ok := l[nri.TimeField].(float64)
		if !ok || total <= 0 {
			t.Errorf("%s: %s = %v; want the handler's time in ms", c.pod, nri.TimeField, l[nri.TimeField])
		}
		sum := 0.0
		for _, ph := range c.phases {
			v, ok := l[calltrace.FieldPrefix+ph+"_ms"].(float64)
			if !ok {
				t.Errorf("%s: no phase %s in %v", c.pod, ph, l)
			}
			sum += v
		}
		if sum > total+0.001 {
			t.Errorf("%s: phases add up to %.3f ms, more than the handler's %.3f ms", c.pod, sum, total)
		}
	}
}
