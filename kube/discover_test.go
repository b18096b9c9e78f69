package kube

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/netns/pins"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// guardEnroller is fakeEnroller with the lifecycle's namespace step: the
// path is opened through a guard and the policy told the identity it
// names now, so that a sighting's identity is checked as in the daemon.
type guardEnroller struct {
	*fakeEnroller
	guard *netns.Guard
}

func (e *guardEnroller) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	h, err := e.guard.Open(req.GetNetnsPath())
	if err != nil {
		return nil, err
	}
	id := h.ID()
	h.Close()
	adm, err := e.a.Admit(ctx, req, id)
	if err != nil {
		e.a.Added(req, false, err)
		return nil, err
	}
	if adm.NotCaptured != "" {
		e.a.Added(req, false, nil)
		return &nftredirv1.AddPodResponse{NotCapturedReason: adm.NotCaptured}, nil
	}
	r := adm.Request
	e.mu.Lock()
	e.recs[r.GetPodUid()] = &nftredirv1.Pod{PodUid: r.GetPodUid(), PodName: r.GetPodName(), PodNamespace: r.GetPodNamespace(), NetnsPath: r.GetNetnsPath(), PodIps: r.GetPodIps()}
	e.mu.Unlock()
	e.a.Added(req, true, nil)
	return &nftredirv1.AddPodResponse{}, nil
}

// pinNetns makes a namespace whose eth0 carries addr and pins it at
// dir/name with a bind mount, as a runtime pins a sandbox's namespace.
func pinNetns(t *testing.T, dir, name, addr string) *nstest.Netns {
	t.Helper()
	ns := nstest.NewNetns(t)
	ns.IPBatch(t, "link add eth0 type veth peer name peer0", "link set eth0 up", "addr add "+addr+" dev eth0")
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", ns.Path, p).CombinedOutput(); err != nil {
		t.Fatalf("mount --bind: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", p).Run() })
	return ns
}

func runningPod(name, ip string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mesh", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func eventReasons(ctx context.Context, t *testing.T, cs *fake.Clientset, pod string) []string {
	t.Helper()
	evs, err := cs.CoreV1().Events("mesh").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == pod {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}

// pinAgent is an agent of node-1 over a fake API holding the labelled
// namespace "mesh" and pods, finding running pods' namespaces among the
// pins in dir, with cfg's timings; and its guardEnroller, not started.
func pinAgent(t *testing.T, dir string, cfg Config, pods ...*corev1.Pod) (*fake.Clientset, *netns.Guard, *Agent, *guardEnroller) {
	t.Helper()
	objs := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Labels: map[string]string{DefaultModeLabel: DefaultModeEnabled}}}}
	for _, p := range pods {
		objs = append(objs, p)
	}
	cs := fake.NewClientset(objs...)
	guard, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	scanner, err := pins.New(pins.Config{Guard: guard, Dirs: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client, cfg.NodeName, cfg.Dir, cfg.Pins = cs, "node-1", t.TempDir(), scanner
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, guard, a, &guardEnroller{fakeEnroller: &fakeEnroller{a: a, recs: map[string]*nftredirv1.Pod{}}, guard: guard}
}

// TestAgentEnrolsRunningPodsByTheirPins: at start, before the agent
// reports ready, a running pod it never saw a sandbox of is enrolled in
// the one pinned namespace carrying its IP; a pod whose IP no pin carries,
// or two do, is not, gets a Warning Event, and is retried until a pin
// proves it.
func TestAgentEnrolsRunningPodsByTheirPins(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	web := pinNetns(t, dir, "cni-web", "10.77.0.5/24")
	pinNetns(t, dir, "cni-other", "10.77.0.6/24")
	pinNetns(t, dir, "cni-twin-a", "10.77.0.7/24")
	pinNetns(t, dir, "cni-twin-b", "10.77.0.7/24")

	cs, guard, a, e := pinAgent(t, dir, Config{Sweep: 4 * time.Second},
		runningPod("web", "10.77.0.5"),
		runningPod("lost", "10.77.0.9"),
		runningPod("twin", "10.77.0.7"),
		runningPod("pending", ""),
	)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Start(ctx, e); err != nil {
		t.Fatal(err)
	}

	// Start has returned: what the daemon's first ZDS snapshot would hold.
	rec, _ := e.Enrolled("uid-web")
	if rec == nil || rec.GetNetnsPath() != filepath.Join(dir, "cni-web") || rec.GetPodIps()[0] != "10.77.0.5" {
		t.Fatalf("web enrolled as %v; want its pin %s", rec, filepath.Join(dir, "cni-web"))
	}
	s := a.seen.get("uid-web")
	h, err := guard.Open(web.Path)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil || s.NetnsID != h.ID().String() {
		t.Errorf("web's sighting %+v; want its namespace's identity %s", s, h.ID())
	}
	h.Close()
	for _, uid := range []string{"uid-lost", "uid-twin", "uid-pending"} {
		if rec, _ := e.Enrolled(uid); rec != nil {
			t.Errorf("%s enrolled: %v", uid, rec)
		}
	}
	st := a.DiscoveryStats()
	t.Logf("after start: %+v", st)
	if st.Outcomes[DiscoveryProven] != 1 || st.Outcomes[DiscoveryNotFound] < 1 || st.Outcomes[DiscoveryAmbiguous] < 1 || st.Outcomes[DiscoveryNoPodIP] < 1 || st.Unproven != 2 || st.Scans < 1 {
		t.Errorf("discovery stats %+v", st)
	}
	if got, want := a.Unproven(), []string{"mesh/lost (" + ReasonNamespaceNotFound + ")", "mesh/twin (" + ReasonNamespaceAmbiguous + ")"}; !slices.Equal(got, want) {
		t.Errorf("Unproven() = %q, want %q", got, want)
	}
	waitFor(t, "the Events", func() bool {
		return strings.Contains(strings.Join(eventReasons(ctx, t, cs, "lost"), "\n"), ReasonNamespaceNotFound+": ") &&
			strings.Contains(strings.Join(eventReasons(ctx, t, cs, "twin"), "\n"), ReasonNamespaceAmbiguous+": ")
	})
	if evs := eventReasons(ctx, t, cs, "pending"); len(evs) != 0 {
		t.Errorf("a pod with no IP yet got Events %v", evs)
	}
	t.Logf("events: %v %v", eventReasons(ctx, t, cs, "lost"), eventReasons(ctx, t, cs, "twin"))

	// The lost pod's pin appears: a retry proves it.
	pinNetns(t, dir, "cni-lost", "10.77.0.9/24")
	waitFor(t, "the lost pod enrolled", func() bool { r, _ := e.Enrolled("uid-lost"); return r != nil })
	if r, _ := e.Enrolled("uid-lost"); r.GetNetnsPath() != filepath.Join(dir, "cni-lost") {
		t.Errorf("lost enrolled at %s", r.GetNetnsPath())
	}
	waitFor(t, "one pod left unproven", func() bool { return a.DiscoveryStats().Unproven == 1 })
	if got, want := a.Unproven(), []string{"mesh/twin (" + ReasonNamespaceAmbiguous + ")"}; !slices.Equal(got, want) {
		t.Errorf("Unproven() = %q, want %q", got, want)
	}
	if rec, _ := e.Enrolled("uid-twin"); rec != nil {
		t.Errorf("twin enrolled though two namespaces carry its IP: %v", rec)
	}
}

// TestAgentRediscoversAStaleSighting: a pod whose remembered namespace
// path no longer leads to its namespace (the pin gone, or naming another
// namespace now: the sandbox was made again) is looked for among the pins
// at once and enrolled in the one carrying its IP; one whose namespace no
// pin carries is listed as unproven, with its Event, and retried, instead
// of waiting uncaptured and unlisted for the informer's resync.
func TestAgentRediscoversAStaleSighting(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	pinNetns(t, dir, "cni-web-now", "10.78.0.5/24")
	pinNetns(t, dir, "cni-other", "10.78.0.7/24")
	// An hour: anything that happens within the test is not the resync.
	cs, _, a, e := pinAgent(t, dir, Config{Resync: time.Hour, Sweep: time.Hour},
		runningPod("web", "10.78.0.5"),
		runningPod("moved", "10.78.0.6"),
		runningPod("lost", "10.78.0.9"),
	)
	pinNetns(t, dir, "cni-moved-then", "10.78.0.8/24")
	stale := func(name, path, id string) sighting {
		return sighting{PodUID: "uid-" + name, Namespace: "mesh", Name: name, NetnsPath: path, NetnsID: id, SeenAt: time.Now().UTC()}
	}
	for _, v := range []sighting{
		// web's old pin is gone; its namespace is pinned under another name.
		stale("web", filepath.Join(dir, "cni-web-then"), "4:1234:99"),
		// moved's remembered path names another pod's namespace now, and
		// no pin carries its IP.
		stale("moved", filepath.Join(dir, "cni-moved-then"), "4:4321:98"),
	} {
		if err := a.seen.put(v); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Start(ctx, e); err != nil {
		t.Fatal(err)
	}
	// Start has returned.
	if rec, _ := e.Enrolled("uid-web"); rec == nil || rec.GetNetnsPath() != filepath.Join(dir, "cni-web-now") {
		t.Errorf("web enrolled as %v; want at its pin %s", rec, filepath.Join(dir, "cni-web-now"))
	}
	if rec, _ := e.Enrolled("uid-moved"); rec != nil {
		t.Errorf("moved enrolled at %s, another pod's namespace", rec.GetNetnsPath())
	}
	if got, want := a.Unproven(), []string{"mesh/lost (" + ReasonNamespaceNotFound + ")", "mesh/moved (" + ReasonNamespaceNotFound + ")"}; !slices.Equal(got, want) {
		t.Errorf("Unproven() = %q, want %q", got, want)
	}
	waitFor(t, "moved's Event", func() bool {
		return strings.Contains(strings.Join(eventReasons(ctx, t, cs, "moved"), "\n"), ReasonNamespaceNotFound+": ")
	})
	// moved's namespace is pinned: a retry, not the resync, enrols it.
	pinNetns(t, dir, "cni-moved-now", "10.78.0.6/24")
	waitFor(t, "moved enrolled", func() bool { r, _ := e.Enrolled("uid-moved"); return r != nil })
	if r, _ := e.Enrolled("uid-moved"); r.GetNetnsPath() != filepath.Join(dir, "cni-moved-now") {
		t.Errorf("moved enrolled at %s", r.GetNetnsPath())
	}
}
