package kube

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/zds"
)

// These tests hold the annotation logic on client-go's fake clientset;
// e2e's TestK8sAnnotation holds it to a real API server.

type agentRig struct {
	cs  *fake.Clientset
	a   *Agent
	e   *fakeEnroller
	ctx context.Context
	dir string
}

// startAgent runs an agent on node-1 over the objects, with its state in
// dir. proxy serves ZDS: pods are annotated only once acked.
func startAgent(t *testing.T, dir string, proxy bool, recs map[string]*nftredirv1.Pod, objs ...runtime.Object) *agentRig {
	t.Helper()
	cs := fake.NewClientset(objs...)
	a, err := New(Config{Client: cs, NodeName: "node-1", Dir: dir, Sweep: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if recs == nil {
		recs = map[string]*nftredirv1.Pod{}
	}
	e := &fakeEnroller{a: a, recs: recs}
	if proxy {
		e.proxy = map[string]string{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Start(ctx, e); err != nil {
		t.Fatal(err)
	}
	return &agentRig{cs: cs, a: a, e: e, ctx: ctx, dir: dir}
}

func nsObj(name string, mesh bool) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if mesh {
		ns.Labels = map[string]string{DefaultModeLabel: DefaultModeEnabled}
	}
	return ns
}

func annotatedPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func (r *agentRig) redirection(t *testing.T, ns, name string) (string, bool) {
	t.Helper()
	p, err := r.cs.CoreV1().Pods(ns).Get(r.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := p.Annotations[RedirectionAnnotation]
	return v, ok
}

func (r *agentRig) waitRedirection(t *testing.T, ns, name, want string) {
	t.Helper()
	waitFor(t, name+" "+RedirectionAnnotation+"="+want, func() bool {
		v, ok := r.redirection(t, ns, name)
		if want == "" {
			return !ok
		}
		return v == want
	})
}

// cniAdd is the runtime's AddPod of ns/name.
func (r *agentRig) cniAdd(t *testing.T, ns, name string) *nftredirv1.AddPodResponse {
	t.Helper()
	req := &nftredirv1.AddPodRequest{PodUid: "uid-" + name, PodName: name, PodNamespace: ns, NetnsPath: "/run/netns/" + name}
	resp, err := r.e.AddPod(r.ctx, req)
	if err != nil {
		t.Fatalf("AddPod %s/%s: %v", ns, name, err)
	}
	return resp
}

// settle lets every queued sync run.
func (r *agentRig) settle() {
	time.Sleep(300 * time.Millisecond)
	for r.a.queue.Len() > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
}

// TestAgentLeavesOthersAnnotation: pods someone else annotated (istio-cni
// before nftredir started) and nftredir does not capture keep their
// annotation, whatever the policy says of them: one in an unlabelled
// namespace, one in a labelled namespace whose sandbox nftredir never saw,
// one pending. Before, the agent removed all three at start.
func TestAgentLeavesOthersAnnotation(t *testing.T) {
	enabled := map[string]string{RedirectionAnnotation: redirectionEnabled}
	r := startAgent(t, t.TempDir(), true, nil,
		nsObj("mesh", true), nsObj("plain", false),
		annotatedPod("plain", "foreign", enabled),
		annotatedPod("mesh", "unseen", enabled),
		annotatedPod("mesh", "half", map[string]string{RedirectionAnnotation: redirectionPending}),
	)
	if resp := r.cniAdd(t, "plain", "foreign"); resp.GetNotCapturedReason() == "" {
		t.Fatal("pod in an unlabelled namespace captured")
	}
	for _, uid := range []string{"uid-foreign", "uid-unseen", "uid-half"} {
		r.a.queue.Add(uid) // what a sweep or an update does
	}
	r.settle()
	for _, p := range []struct{ ns, name, want string }{{"plain", "foreign", redirectionEnabled}, {"mesh", "unseen", redirectionEnabled}, {"mesh", "half", redirectionPending}} {
		if v, ok := r.redirection(t, p.ns, p.name); !ok || v != p.want {
			t.Errorf("%s/%s: annotation %q (present %v) after nftredir synced it; want %q, untouched", p.ns, p.name, v, ok, p.want)
		}
	}
	for _, a := range r.cs.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("the agent patched a pod it never captured: %v", a)
		}
	}
}

// TestAgentAnnotatesAfterAck: with ZDS served, a captured pod is
// "pending" until the proxy acks it, then "enabled"; a proxy that later
// goes away does not turn it back.
func TestAgentAnnotatesAfterAck(t *testing.T) {
	r := startAgent(t, t.TempDir(), true, nil, nsObj("mesh", true), annotatedPod("mesh", "web", nil))
	r.cniAdd(t, "mesh", "web")
	r.waitRedirection(t, "mesh", "web", redirectionPending)
	r.settle()
	if v, _ := r.redirection(t, "mesh", "web"); v != redirectionPending {
		t.Fatalf("annotation %q before any ack; want %q", v, redirectionPending)
	}
	r.e.setProxyState("uid-web", zds.StateAcked)
	r.a.ProxyAcked("uid-web")
	r.waitRedirection(t, "mesh", "web", redirectionEnabled)

	r.e.setProxyState("uid-web", "no proxy connected")
	r.a.queue.Add("uid-web")
	r.settle()
	if v, _ := r.redirection(t, "mesh", "web"); v != redirectionEnabled {
		t.Errorf("annotation %q after the proxy went away; want it left %q", v, redirectionEnabled)
	}
}

// TestAgentAnnotatesAtOnceWithoutZDS: with no ZDS there is no ack to
// wait for (WatchPods has none): captured is "enabled".
func TestAgentAnnotatesAtOnceWithoutZDS(t *testing.T) {
	r := startAgent(t, t.TempDir(), false, nil, nsObj("mesh", true), annotatedPod("mesh", "web", nil))
	r.cniAdd(t, "mesh", "web")
	r.waitRedirection(t, "mesh", "web", redirectionEnabled)
}

// TestAgentRemovesItsAnnotationOnRelease: the annotation of a pod nftredir
// captured goes when nftredir releases the pod, also when the pod was
// annotated by istio-cni before nftredir took it over.
func TestAgentRemovesItsAnnotationOnRelease(t *testing.T) {
	r := startAgent(t, t.TempDir(), false, nil, nsObj("mesh", true),
		annotatedPod("mesh", "web", map[string]string{RedirectionAnnotation: redirectionEnabled}))
	r.cniAdd(t, "mesh", "web")
	r.settle()
	if !r.a.marks.has("uid-web") {
		t.Fatal("captured pod not marked as annotated by nftredir")
	}
	patch := []byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":null}}}`)
	if _, err := r.cs.CoreV1().Namespaces().Patch(r.ctx, "mesh", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitRedirection(t, "mesh", "web", "")
	if rec, _ := r.e.Enrolled("uid-web"); rec != nil {
		t.Error("pod still enrolled after its namespace was unlabelled")
	}
	if r.a.marks.has("uid-web") {
		t.Error("mark kept after the annotation was removed")
	}
}

// TestAgentMarksSurviveRestart: which annotations are nftredir's is known
// after a restart, with or without the capture record: a pod released
// while its annotation could not be removed (the API refused the patch)
// has it removed by the next daemon.
func TestAgentMarksSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	objs := []runtime.Object{nsObj("mesh", true), annotatedPod("mesh", "web", nil), annotatedPod("mesh", "other", map[string]string{RedirectionAnnotation: redirectionEnabled})}
	r := startAgent(t, dir, false, nil, objs...)
	r.cniAdd(t, "mesh", "web")
	r.waitRedirection(t, "mesh", "web", redirectionEnabled)

	// The next daemon finds the pod annotated and marked, but released
	// (its record gone, as after a CNI DEL whose follow-up never ran),
	// and its namespace unknown.
	pod, err := r.cs.CoreV1().Pods("mesh").Get(r.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	objs[1] = pod
	if err := r.a.seen.forget("uid-web"); err != nil {
		t.Fatal(err)
	}
	if m, err := openMarks(filepath.Join(dir, marksDir), nil); err != nil || !m.has("uid-web") {
		t.Fatalf("the mark is not on disk for the next daemon (err %v)", err)
	}
	r2 := startAgent(t, dir, false, nil, objs...)
	// Start's first pass already brought it in line.
	if _, ok := r2.redirection(t, "mesh", "web"); ok {
		t.Error("annotation nftredir wrote stays on a pod it no longer captures")
	}
	if r2.a.marks.has("uid-web") {
		t.Error("mark kept after the annotation was removed")
	}
	if v, ok := r2.redirection(t, "mesh", "other"); !ok || v != redirectionEnabled {
		t.Errorf("someone else's annotation changed to %q (present %v)", v, ok)
	}
}

// TestAgentDropsMarksOfGonePods: a mark whose pod left the API while the
// daemon was down (the cache never sees it) is checked by name and
// dropped at start, so the marks do not grow without end.
func TestAgentDropsMarksOfGonePods(t *testing.T) {
	dir := t.TempDir()
	m, err := openMarks(filepath.Join(dir, marksDir), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.put("uid-gone", podRef{"mesh", "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := m.put("uid-web", podRef{"mesh", "web"}); err != nil {
		t.Fatal(err)
	}
	r := startAgent(t, dir, false, nil, nsObj("mesh", true), annotatedPod("mesh", "web", map[string]string{RedirectionAnnotation: redirectionEnabled}))
	if r.a.marks.has("uid-gone") {
		t.Error("the mark of a pod gone from the API is still kept")
	}
	if again, err := openMarks(filepath.Join(dir, marksDir), nil); err != nil || again.has("uid-gone") {
		t.Errorf("the gone pod's mark is still on disk (err %v)", err)
	}
	// web is not captured (no sighting, no record) but was marked: its
	// annotation is nftredir's, so it goes, and the mark with it.
	if _, ok := r.redirection(t, "mesh", "web"); ok || r.a.marks.has("uid-web") {
		t.Errorf("marked, uncaptured pod: annotation present %v, mark kept %v; want both gone", ok, r.a.marks.has("uid-web"))
	}
}

// patches are the redirection values the agent's patches wrote ("" for a
// removal), in order.
func (r *agentRig) patches() []string {
	var out []string
	for _, a := range r.cs.Actions() {
		p, ok := a.(interface{ GetPatch() []byte })
		if !ok || a.GetVerb() != "patch" || a.GetResource().Resource != "pods" {
			continue
		}
		var body struct {
			Metadata struct {
				Annotations map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		if json.Unmarshal(p.GetPatch(), &body) != nil {
			continue
		}
		if v, ok := body.Metadata.Annotations[RedirectionAnnotation]; ok {
			out = append(out, ptrOr(v))
		}
	}
	return out
}

func ptrOr(v *string) string {
	if v == nil {
		return ""
	}
	return *v
}

// TestAgentRuntimeAddPodIsNotRepeated: the sync that follows a runtime's
// AddPod (to annotate the pod) does not enrol the pod a second time.
// Before, it did: a whole table apply while the runtime was still
// starting the sandbox.
func TestAgentRuntimeAddPodIsNotRepeated(t *testing.T) {
	r := startAgent(t, t.TempDir(), false, nil, nsObj("mesh", true), annotatedPod("mesh", "web", nil))
	r.cniAdd(t, "mesh", "web")
	r.waitRedirection(t, "mesh", "web", redirectionEnabled)
	r.settle()
	if n := r.e.agentEnrols.Load(); n != 0 {
		t.Errorf("the agent enrolled the pod %d more times after the runtime's AddPod captured it; want none", n)
	}
	// A changed option annotation is still applied.
	patch := []byte(`{"metadata":{"annotations":{"nftredir.io/capture-mode":"redirect"}}}`)
	if _, err := r.cs.CoreV1().Pods("mesh").Patch(r.ctx, "web", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a re-enrolment after the annotation changed", func() bool { return r.e.agentEnrols.Load() > 0 })
}

// TestAgentPatchesOnceWhenAckedSoon: a pod the proxy acks right after its
// enrolment is patched once, "enabled", never "pending" first; one that
// is not acked shows "pending" once pendingGrace has passed.
func TestAgentPatchesOnceWhenAckedSoon(t *testing.T) {
	r := startAgent(t, t.TempDir(), true, nil, nsObj("mesh", true), annotatedPod("mesh", "web", nil), annotatedPod("mesh", "slow", nil))
	r.e.stamp = true
	r.cniAdd(t, "mesh", "web")
	time.Sleep(50 * time.Millisecond)
	r.e.setProxyState("uid-web", zds.StateAcked)
	r.a.ProxyAcked("uid-web")
	r.waitRedirection(t, "mesh", "web", redirectionEnabled)
	r.settle()
	if got := r.patches(); len(got) != 1 || got[0] != redirectionEnabled {
		t.Errorf("patches %q; want one, %q", got, redirectionEnabled)
	}

	added := time.Now()
	r.cniAdd(t, "mesh", "slow")
	r.waitRedirection(t, "mesh", "slow", redirectionPending)
	if took := time.Since(added); took < pendingGrace-100*time.Millisecond {
		t.Errorf("an unacked pod was annotated %q after %v; want no sooner than %v", redirectionPending, took, pendingGrace)
	}
	if !r.a.marks.has("uid-slow") {
		t.Error("the pending pod is not marked as nftredir's")
	}
}

// TestAgentAnnotatesAfterTheSandbox: the work an AddPod and an ack queue
// (the annotation patch) waits until the runtime has likely finished the
// sandbox, off the cores it needs, and then happens.
func TestAgentAnnotatesAfterTheSandbox(t *testing.T) {
	r := startAgent(t, t.TempDir(), true, nil, nsObj("mesh", true), annotatedPod("mesh", "web", nil))
	r.e.setProxyState("uid-web", zds.StateAcked)
	patches := func() int {
		n := 0
		for _, a := range r.cs.Actions() {
			if a.GetVerb() == "patch" {
				n++
			}
		}
		return n
	}
	r.settle() // the start's own syncs, which the informer queues
	before := patches()
	begin := time.Now()
	r.cniAdd(t, "mesh", "web")
	r.a.ProxyAcked("uid-web")
	time.Sleep(afterSandbox / 2)
	if n := patches(); n != before && time.Since(begin) < afterSandbox {
		t.Fatalf("%d patches within %s of the AddPod; want none before %s", n-before, time.Since(begin), afterSandbox)
	}
	r.waitRedirection(t, "mesh", "web", redirectionEnabled)
}
