package e2e

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// sandbox is what must not change when nftredir enrols a running pod in
// place: the runtime's sandbox (its id and the namespace it pinned) and
// the containers' restart counts.
type sandbox struct {
	ids      []string
	netns    string
	restarts int32
}

// sandboxOf asks the runtime (CRI) for the pod's ready sandboxes and
// reads its restart count from the API.
func (m *meshCluster) sandboxOf(t *testing.T, p *corev1.Pod) sandbox {
	t.Helper()
	cri := m.CRI(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)},
	}})
	if err != nil {
		t.Fatalf("CRI ListPodSandbox: %v", err)
	}
	var sb sandbox
	for _, s := range resp.GetItems() {
		if s.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
			continue
		}
		sb.ids = append(sb.ids, s.GetId())
		st, err := cri.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: s.GetId(), Verbose: true})
		if err != nil {
			t.Fatalf("CRI PodSandboxStatus: %v", err)
		}
		sb.netns = sandboxNetns(st.GetInfo()["info"])
	}
	slices.Sort(sb.ids)
	got, err := m.Client.CoreV1().Pods(p.Namespace).Get(t.Context(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.ContainerStatuses {
		sb.restarts += c.RestartCount
	}
	return sb
}

// sandboxNetns is the network namespace path in containerd's verbose
// sandbox info (its runtimeSpec's namespaces).
func sandboxNetns(info string) string {
	const key = `"type":"network","path":"`
	i := strings.Index(info, key)
	if i < 0 {
		return ""
	}
	rest := info[i+len(key):]
	if j := strings.IndexByte(rest, '"'); j > 0 {
		return rest[:j]
	}
	return ""
}

// sameFile reports whether two paths name the same namespace file.
func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Fatalf("stat %s: %v", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Fatalf("stat %s: %v", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// wantUnchanged fails unless the pod still runs in the sandbox it had
// before nftredir, with no container restarted.
func (m *meshCluster) wantUnchanged(t *testing.T, p *corev1.Pod, before sandbox) {
	t.Helper()
	after := m.sandboxOf(t, p)
	if !slices.Equal(after.ids, before.ids) || len(after.ids) != 1 || after.restarts != before.restarts {
		t.Errorf("pod %s/%s: sandboxes %v restarts %d, before nftredir %v restarts %d; want one, unchanged", p.Namespace, p.Name, after.ids, after.restarts, before.ids, before.restarts)
	}
}

// wantEnrolledInPlace checks a record of a running pod: its namespace is
// the one the runtime pinned for the pod's sandbox.
func (m *meshCluster) wantEnrolledInPlace(t *testing.T, rec *nftredirv1.Pod, p *corev1.Pod, before sandbox) {
	t.Helper()
	if rec == nil {
		t.Fatalf("pod %s/%s is not enrolled", p.Namespace, p.Name)
	}
	if !sameFile(t, rec.GetNetnsPath(), before.netns) {
		t.Errorf("pod %s/%s enrolled in %s; the runtime's sandbox namespace is %s", p.Namespace, p.Name, rec.GetNetnsPath(), before.netns)
	}
	if !slices.Contains(rec.GetPodIps(), p.Status.PodIP) {
		t.Errorf("record IPs %v, pod IP %s", rec.GetPodIps(), p.Status.PodIP)
	}
	m.wantUnchanged(t, p, before)
}

// scrapeNode reads the daemon's /metrics at addr inside the node
// namespace.
func (m *meshCluster) scrapeNode(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: m.DialContext}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// TestK8sRunningPodsEnrolled installs nftredir on a node whose pods were
// started before it (the plugin not chained, the daemon not running), as
// on a cut-over from another CNI agent: the daemon finds each running
// pod's namespace among the runtime's pins, proves it by the pod's IP,
// and enrols the pod in place.
func TestK8sRunningPodsEnrolled(t *testing.T) {
	m := newMeshCluster(t)
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	for _, ns := range []string{"later", "twins", "hidden"} {
		m.CreateNamespace(t, ns, nil)
	}
	// Before nftredir: every pod on the bridge alone.
	pods := map[string]*corev1.Pod{}
	for _, p := range [][2]string{{"mesh", "early"}, {"later", "late"}, {"twins", "twin"}, {"hidden", "hidden"}} {
		pods[p[1]] = m.runPod(t, p[0], p[1])
	}
	before := map[string]sandbox{}
	for name, p := range pods {
		wantDirect(t, m.answer(t, p), name)
		// For comparison with the pin scan the daemon logs: the same
		// question put to the runtime over CRI.
		criStart := time.Now()
		before[name] = m.sandboxOf(t, p)
		t.Logf("CRI ListPodSandbox + PodSandboxStatus (and a pod GET) for %s: %s", name, time.Since(criStart).Round(time.Microsecond))
		if len(before[name].ids) != 1 || before[name].netns == "" {
			t.Fatalf("pod %s: sandboxes %v, netns %q", name, before[name].ids, before[name].netns)
		}
	}

	start := time.Now()
	m.startMesh(t)
	serving := time.Since(start)
	// The first ZDS snapshot, taken right after SERVING, must hold the
	// running mesh pod: a proxy drops every workload not in it.
	peer := zdstest.Dial(t, m.zds)
	snap := peer.Handshake()

	t.Run("a pod running before nftredir is enrolled in place before SERVING", func(t *testing.T) {
		p := pods["early"]
		rec := m.enrolled(t, p.UID)
		m.wantEnrolledInPlace(t, rec, p, before["early"])
		var add *zdstest.Request
		for i, r := range snap {
			if r.Kind == zdstest.Add && r.UID == string(p.UID) {
				add = &snap[i]
			}
		}
		if add == nil {
			t.Fatalf("the first ZDS snapshot has no add for %s: %v", p.UID, snap)
		}
		var st unix.Stat_t
		if err := unix.Stat(before["early"].netns, &st); err != nil {
			t.Fatal(err)
		}
		if len(add.Fds) != 1 {
			t.Fatalf("ZDS add for %s carries %d fds", p.Name, len(add.Fds))
		}
		if dev, ino := zdstest.NetnsOf(t, add.Fds[0]); dev != st.Dev || ino != st.Ino {
			t.Errorf("ZDS handed namespace %d:%d for %s; its sandbox's is %d:%d", dev, ino, p.Name, st.Dev, st.Ino)
		}
		peer.Close()
		m.proxyIn(t, rec)
		wantCaptured(t, m.answer(t, p), "early")
		m.waitAnnotation(t, p, redirectionEnabled)
		found := m.daemon.logEntries(t, "running pod's namespace found and proven by its IPs")
		if len(found) == 0 {
			t.Error("the daemon did not log the proof")
		} else {
			t.Logf("daemon start to SERVING %s; proof: %v", serving.Round(time.Millisecond), found[0])
		}
		for name, p := range pods {
			if name != "early" && m.enrolled(t, p.UID) != nil {
				t.Errorf("pod %s in an unlabelled namespace was enrolled", name)
			}
		}
	})

	t.Run("labelling the namespace of a pod running before nftredir enrols it in place", func(t *testing.T) {
		p := pods["late"]
		start := time.Now()
		m.label(t, "namespace", "", "later", meshEnabled)
		rec := m.waitEnrolled(t, p.UID, true)
		took := time.Since(start)
		m.wantEnrolledInPlace(t, rec, p, before["late"])
		m.proxyIn(t, rec)
		wantCaptured(t, m.answer(t, p), "late")
		t.Logf("namespace labelled: running pod enrolled in %s", took.Round(time.Millisecond))
	})

	t.Run("a pod whose IP two namespaces carry is refused with an Event until one is gone", func(t *testing.T) {
		p := pods["twin"]
		// A look-alike pinned where the runtime pins (/run/netns), with
		// the pod's IP on an interface: what a /proc scan could pair the
		// pod with.
		decoy := nstest.NewNetns(t)
		decoy.IPBatch(t, "link add eth0 type veth peer name peer0", "link set eth0 up", "addr add "+p.Status.PodIP+"/24 dev eth0")
		// A scan younger than kube.ScanMaxAge (the previous subtest's)
		// may serve this pod and predate the decoy; then the pod is
		// proven by its own pin alone, which is right but not what this
		// subtest is about.
		time.Sleep(kube.ScanMaxAge + 200*time.Millisecond)
		m.label(t, "namespace", "", "twins", meshEnabled)
		m.waitEvent(t, p, kube.ReasonNamespaceAmbiguous, p.Status.PodIP)
		if rec := m.enrolled(t, p.UID); rec != nil {
			t.Fatalf("pod enrolled though two namespaces carry its IP: %v", rec)
		}
		wantDirect(t, m.answer(t, p), "twin")
		// The look-alike loses the address: the next retry proves the
		// pod's own namespace.
		decoy.IP(t, "link", "del", "eth0")
		deadline := time.Now().Add(45 * time.Second)
		var rec *nftredirv1.Pod
		for rec = m.enrolled(t, p.UID); rec == nil; rec = m.enrolled(t, p.UID) {
			if time.Now().After(deadline) {
				t.Fatalf("pod not enrolled 45 s after the look-alike lost its IP\n%s", m.daemon.tailLog(30))
			}
			time.Sleep(200 * time.Millisecond)
		}
		m.wantEnrolledInPlace(t, rec, p, before["twin"])
		t.Logf("refused while two namespaces carried %s; enrolled %s after the look-alike lost it", p.Status.PodIP, time.Since(deadline.Add(-45*time.Second)).Round(time.Millisecond))
	})

	t.Run("a pod whose namespace is in no pin directory gets an Event and is not enrolled", func(t *testing.T) {
		p := pods["hidden"]
		// The daemon looks in an empty directory only: the pod's pin is
		// out of its sight, as on a runtime pinning elsewhere.
		m.daemon.stop(t)
		args := m.daemon.args
		empty := t.TempDir()
		const metrics = "127.0.0.1:19914"
		m.daemon.args = append(slices.Clone(args), "--netns-dirs", empty, "--metrics-address", metrics)
		m.daemon.start(t)
		m.label(t, "namespace", "", "hidden", meshEnabled)
		m.waitEvent(t, p, kube.ReasonNamespaceNotFound, p.Status.PodIP)
		if rec := m.enrolled(t, p.UID); rec != nil {
			t.Fatalf("pod enrolled though no pin carries its IP: %v", rec)
		}
		wantDirect(t, m.answer(t, p), "hidden")
		var why map[string]any
		for _, l := range m.daemon.logEntries(t, "pod should be captured, but its network namespace cannot be proven; not enrolled, retrying") {
			if l["name"] == "hidden" && l["reason"] == kube.ReasonNamespaceNotFound {
				why = l
			}
		}
		if why == nil {
			t.Error("the daemon did not log why the hidden pod is not enrolled")
		} else {
			t.Logf("log: %v", why)
		}
		fams := m.scrapeNode(t, metrics)
		if n := counter(fams, "nftredir_kube_netns_discoveries_total", map[string]string{"outcome": "not_found"}); n < 1 {
			t.Errorf("nftredir_kube_netns_discoveries_total{outcome=not_found} = %v", n)
		}
		if n := gauge(fams, "nftredir_kube_pods_netns_unproven"); n != 1 {
			t.Errorf("nftredir_kube_pods_netns_unproven = %v, want 1", n)
		}
		if n := counter(fams, "nftredir_kube_pin_scans_total", nil); n < 1 {
			t.Errorf("nftredir_kube_pin_scans_total = %v", n)
		}
		// Back to the runtime's pin directory: enrolled at start.
		m.daemon.stop(t)
		m.daemon.args = args
		m.daemon.start(t)
		m.wantEnrolledInPlace(t, m.enrolled(t, p.UID), p, before["hidden"])
	})

	for name, p := range pods {
		m.wantUnchanged(t, p, before[name])
	}
}
