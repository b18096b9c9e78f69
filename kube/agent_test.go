package kube

import (
	"context"
	"google.golang.org/protobuf/types/known/timestamppb"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// fakeEnroller keeps the server's side of the contract the agent relies
// on: AddPod runs the policy's Admit and then reports to Added, for the
// runtime's AddPods and the agent's own enrolments alike.
type fakeEnroller struct {
	a           *Agent
	mu          sync.Mutex
	recs        map[string]*nftredirv1.Pod
	agentEnrols atomic.Int64
	// proxy, when set, is ZDS served: each pod's state with the node
	// proxy ("no proxy connected" when absent), as the manager reports it.
	proxy map[string]string
	// stamp gives records their enrolment time, as the manager does.
	stamp bool
	// refuse, when set, is the kernel's answer to an admitted AddPod:
	// the error it fails with, after the policy admitted the pod.
	refuse atomic.Pointer[error]
}

// withProxyState is rec as the manager returns it: with the pod's ZDS
// state when ZDS is served. The caller holds e.mu.
func (e *fakeEnroller) withProxyState(rec *nftredirv1.Pod) *nftredirv1.Pod {
	if rec == nil || e.proxy == nil {
		return rec
	}
	c := proto.Clone(rec).(*nftredirv1.Pod)
	st, ok := e.proxy[rec.GetPodUid()]
	if !ok {
		st = "no proxy connected"
	}
	c.ZdsState = &st
	return c
}

// setProxyState changes what the node proxy holds of the pod.
func (e *fakeEnroller) setProxyState(uid, st string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.proxy[uid] = st
}

var fakeID = netns.ID{Dev: 4, Ino: 4026530000}

func (e *fakeEnroller) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	if fromAgent(ctx) {
		e.agentEnrols.Add(1)
	}
	adm, err := e.a.Admit(ctx, req, fakeID)
	if err != nil {
		e.a.Added(req, false, err)
		return nil, err
	}
	if adm.NotCaptured != "" {
		e.a.Added(req, false, nil)
		return &nftredirv1.AddPodResponse{NotCapturedReason: adm.NotCaptured}, nil
	}
	if refused := e.refuse.Load(); refused != nil {
		e.a.Added(req, false, *refused)
		return nil, *refused
	}
	r := adm.Request
	e.mu.Lock()
	rec := &nftredirv1.Pod{PodUid: r.GetPodUid(), PodName: r.GetPodName(), PodNamespace: r.GetPodNamespace(), NetnsPath: r.GetNetnsPath(), Options: r.GetOptions(),
		NetnsId: fakeID.String(), PodIps: r.GetPodIps()}
	if e.stamp {
		rec.EnrolledAt = timestamppb.Now()
	}
	e.recs[r.GetPodUid()] = rec
	rec = e.withProxyState(rec)
	e.mu.Unlock()
	e.a.Added(req, true, nil)
	return &nftredirv1.AddPodResponse{Pod: rec}, nil
}

func (e *fakeEnroller) Release(_ context.Context, uid string) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.recs[uid]
	delete(e.recs, uid)
	return ok, nil
}

func (e *fakeEnroller) Enrolled(uid string) (*nftredirv1.Pod, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.withProxyState(e.recs[uid]), nil
}

func (e *fakeEnroller) EnrolledUIDs() ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var uids []string
	for u := range e.recs {
		uids = append(uids, u)
	}
	return uids, nil
}

// startMeshAgent runs an agent on node-1 whose API has namespace mesh,
// opted in, and its running pod web.
func startMeshAgent(t *testing.T) (*fake.Clientset, *Agent, *fakeEnroller, context.Context) {
	t.Helper()
	cs := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Labels: map[string]string{DefaultModeLabel: DefaultModeEnabled}}},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "mesh", UID: "uid-web"},
			Spec:       corev1.PodSpec{NodeName: "node-1"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		},
	)
	a, err := New(Config{Client: cs, NodeName: "node-1", Dir: t.TempDir(), Sweep: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEnroller{a: a, recs: map[string]*nftredirv1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Start(ctx, e); err != nil {
		t.Fatal(err)
	}
	return cs, a, e, ctx
}

// enrolByCNI is the runtime's AddPod (CNI ADD) of mesh/web; it returns
// once the agent has annotated the pod.
func enrolByCNI(ctx context.Context, t *testing.T, cs *fake.Clientset, e *fakeEnroller) {
	t.Helper()
	req := &nftredirv1.AddPodRequest{PodUid: "uid-web", PodName: "web", PodNamespace: "mesh", NetnsPath: "/run/netns/web"}
	if resp, err := e.AddPod(ctx, req); err != nil || resp.GetNotCapturedReason() != "" {
		t.Fatalf("Enrol: %v %v", resp, err)
	}
	waitFor(t, "the annotation", func() bool {
		p, err := cs.CoreV1().Pods("mesh").Get(ctx, "web", metav1.GetOptions{})
		return err == nil && p.Annotations[RedirectionAnnotation] == "enabled"
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentOwnEnrolmentDoesNotRequeue: once a captured pod is in line,
// the agent leaves it alone. Its own re-enrolment in sync reports to
// Added like any other; queueing the pod from there made every sync start
// the next, an endless loop of table applies (about 900 a second per pod
// on a test node).
func TestAgentOwnEnrolmentDoesNotRequeue(t *testing.T) {
	cs, _, e, ctx := startMeshAgent(t)
	enrolByCNI(ctx, t, cs, e)
	// The annotation's own update event may bring one more sync; after
	// that the pod is in line and nothing should enrol it again.
	time.Sleep(300 * time.Millisecond)
	before := e.agentEnrols.Load()
	time.Sleep(time.Second)
	after := e.agentEnrols.Load()
	t.Logf("agent enrolments: %d after the annotation, %d a second later", before, after)
	if after != before || after > 3 {
		t.Errorf("the agent re-enrolled an unchanged pod %d times in a second (%d in all); want none", after-before, after)
	}
}

// TestAgentReenrolsOnlyWhenOptionsChange: a sync of a captured pod whose
// option annotations are as last applied (a sweep, a status update) does
// not touch the kernel; a changed annotation is applied.
func TestAgentReenrolsOnlyWhenOptionsChange(t *testing.T) {
	cs, a, e, ctx := startMeshAgent(t)
	enrolByCNI(ctx, t, cs, e)
	time.Sleep(300 * time.Millisecond)
	before := e.agentEnrols.Load()
	for range 5 {
		a.queue.Add("uid-web") // what the sweep does
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if n := e.agentEnrols.Load() - before; n != 0 {
		t.Errorf("unchanged pod re-enrolled %d times by syncs", n)
	}
	patch := []byte(`{"metadata":{"annotations":{"nftredir.io/capture-mode":"redirect"}}}`)
	if _, err := cs.CoreV1().Pods("mesh").Patch(ctx, "web", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a re-enrolment after the annotation changed", func() bool { return e.agentEnrols.Load() > before })
}

// TestAgentKeepsPodIPsTheAPIMomentarilyLacks (istio#60471): the API can
// show no IPs for a pod for a moment; a re-enrolment then must not drop
// the addresses the pod was enrolled with (its namespace is the same, so
// they have not changed), or the node probe set loses them and the
// kubelet's probes are captured until the pod restarts.
func TestAgentKeepsPodIPsTheAPIMomentarilyLacks(t *testing.T) {
	cs, a, e, ctx := startMeshAgent(t)
	setIPs := func(ips ...string) {
		t.Helper()
		p, err := cs.CoreV1().Pods("mesh").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.PodIPs = nil
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		if _, err := cs.CoreV1().Pods("mesh").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	recIPs := func() []string {
		r, _ := e.Enrolled("uid-web")
		return r.GetPodIps()
	}
	want := []string{"10.1.2.3", "fd00::3"}
	setIPs(want...)
	waitFor(t, "the agent's cache to see the pod's IPs", func() bool {
		p, err := a.podList.Pods("mesh").Get("web")
		return err == nil && len(p.Status.PodIPs) == 2
	})
	// The runtime's CNI ADD gives no IPs here; the API's are taken.
	enrolByCNI(ctx, t, cs, e)
	if got := recIPs(); !slices.Equal(got, want) {
		t.Fatalf("enrolled with IPs %v; want the API's %v", got, want)
	}
	time.Sleep(300 * time.Millisecond)
	before := e.agentEnrols.Load()
	setIPs()
	patch := []byte(`{"metadata":{"annotations":{"nftredir.io/capture-mode":"redirect"}}}`)
	if _, err := cs.CoreV1().Pods("mesh").Patch(ctx, "web", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a re-enrolment after the annotation changed", func() bool { return e.agentEnrols.Load() > before })
	if got := recIPs(); !slices.Equal(got, want) {
		t.Errorf("after a re-enrolment while the API showed no IPs the record has %v; want %v kept", got, want)
	}
}
