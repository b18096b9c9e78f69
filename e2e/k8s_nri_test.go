package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/nri"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// startNRIMesh is a cluster whose containerd requires the nftredir NRI
// plugin (its default validator, as docs/nri.md has the operator
// configure it), and an nftredird in Kubernetes mode enrolling through
// NRI: no nftredir-cni in the pod network's chain. Running pods are not
// looked for among the runtime's pins (--netns-dirs=), so a pod started
// while the daemon was away is captured by Synchronize or not at all.
func startNRIMesh(t *testing.T, nri kcluster.NRIOptions, o daemonOpts) *meshCluster {
	t.Helper()
	dir := t.TempDir()
	nri.Validator = nriValidator()
	c := startClusterWith(t, kcluster.Options{NRI: nri})
	c.CreateNamespace(t, "nftredir-system", nil)
	c.ApplyYAML(t, chartRBAC(t, c))
	m := &meshCluster{Cluster: c, dir: dir, zds: filepath.Join(dir, "zds.sock")}
	m.kubeconfig = c.ServiceAccountKubeconfig(t, "nftredir-system", "nftredir")
	o.dir, o.netns = dir, c.Netns.Path
	o.args = append([]string{
		"--kubernetes", "--kubeconfig", m.kubeconfig, "--node-name", m.NodeName,
		"--kubernetes-state-dir=", "--netns-dirs=",
		"--zds-socket", m.zds,
		"--enrolment", defaults.EnrolmentNRI, "--nri-socket", c.NRISocket,
		"--nri-gate-file", filepath.Join(dir, "nri-gate"),
	}, o.args...)
	m.daemon = startDaemon(t, o)
	m.api = m.daemon.client(t)
	if strings.Contains(string(c.Conflist()), "nftredir-cni") {
		t.Fatalf("the pod network chains nftredir-cni: %s", c.Conflist())
	}
	return m
}

// nriValidator is containerd's default validator as docs/nri.md has the
// operator configure it: nftredir required, nftredir's own pods tolerated.
func nriValidator() *kcluster.NRIValidator {
	return &kcluster.NRIValidator{RequiredPlugins: []string{defaults.NRIPluginName}, TolerateMissingPluginsAnnotation: defaults.NRITolerateAnnotation}
}

// nriChartValues are the chart's values for NRI enrolment on c: the daemon
// dials the cluster's NRI socket.
func nriChartValues(t *testing.T, c *kcluster.Cluster) map[string]any {
	t.Helper()
	if filepath.Base(c.NRISocket) != filepath.Base(defaults.NRISocket) {
		t.Fatalf("the cluster's NRI socket %s is not named as the chart dials it (%s)", c.NRISocket, defaults.NRISocket)
	}
	return map[string]any{
		"enrolment": map[string]any{"via": defaults.EnrolmentNRI},
		"hostPaths": map[string]any{"nriDir": filepath.Dir(c.NRISocket)},
	}
}

// waitNRIDoor waits until the chart's daemon has written its gate file
// (registered with a runtime whose validator holds pods back) and the
// install step has taken nftredir-cni out of the network, in the file and
// in what containerd has loaded: from then on a new pod is enrolled
// through NRI alone.
func waitNRIDoor(t *testing.T, c *kcluster.Cluster, h dsHost) {
	t.Helper()
	gate := filepath.Join(h.run, filepath.Base(defaults.NRIGateFile))
	deadline := time.Now().Add(kcluster.DefaultTimeout)
	for {
		types, _ := conflistTypes(t, c)
		_, err := os.Stat(gate)
		if err == nil && slices.Equal(types, []string{"bridge"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gate file %s: %v; network plugins %v; want the gate written and nftredir-cni taken out", gate, err, types)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitCRINetwork(t, c, false)
}

// wantNoCNIAdd: nftredir-cni never ran for the pod (its log, when there is
// one, does not name it).
func wantNoCNIAdd(t *testing.T, cniLog string, p *corev1.Pod) {
	t.Helper()
	b, err := os.ReadFile(cniLog)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if strings.Contains(string(b), string(p.UID)) {
		t.Errorf("pod %s/%s went through nftredir-cni, which must not be in the chain under NRI enrolment:\n%s", p.Namespace, p.Name, b)
	}
}

// handlerTimes are the times the daemon's NRI handler event took for the
// pods of uids, from its JSON log's lines for each event.
func handlerTimes(t *testing.T, log, event string, uids map[string]bool) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, l := range strings.Split(log, "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) != nil || line["@message"] != event {
			continue
		}
		if pod, _ := line["pod"].(string); !uids[pod] {
			continue
		}
		ms, ok := line[nri.TimeField].(float64)
		if !ok {
			t.Fatalf("no %s in %s", nri.TimeField, l)
		}
		out = append(out, time.Duration(ms*float64(time.Millisecond)))
	}
	return out
}

// validatorRefusal is containerd's message when its NRI validator refuses
// a container because nftredir is not registered.
const validatorRefusal = `required plugin "` + defaults.NRIPluginName + `" not present`

// refusedByValidator: the pod's container waits, refused by containerd's
// NRI validator because nftredir is not registered.
func refusedByValidator(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && strings.Contains(w.Message, validatorRefusal) {
			return true
		}
	}
	return false
}

// containersOf lists the containers the runtime created for the pod's
// ready sandbox, with their creation times.
func (m *meshCluster) containersOf(t *testing.T, p *corev1.Pod) []*runtimeapi.Container {
	t.Helper()
	cri := m.CRI(t)
	sbs, err := cri.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*runtimeapi.Container
	for _, sb := range sbs.Items {
		ctrs, err := cri.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb.Id}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ctrs.Containers...)
	}
	return out
}

// wantCapturedBeforeContainers: the pod is enrolled, its traffic goes to
// the proxy, and the daemon enrolled it before the runtime created any of
// its containers.
func (m *meshCluster) wantCapturedBeforeContainers(t *testing.T, p *corev1.Pod) *nftredirv1.Pod {
	t.Helper()
	rec := m.wantEnrolledBeforeContainers(t, p)
	m.proxyIn(t, rec)
	wantCaptured(t, m.answer(t, p), p.Name)
	return rec
}

// wantEnrolledBeforeContainers: the pod is enrolled, and was before the
// runtime created any of the containers of its ready sandbox.
func (m *meshCluster) wantEnrolledBeforeContainers(t *testing.T, p *corev1.Pod) *nftredirv1.Pod {
	t.Helper()
	rec := m.enrolled(t, p.UID)
	if rec == nil {
		t.Fatalf("pod %s/%s Ready but not enrolled", p.Namespace, p.Name)
	}
	enrolled := rec.GetEnrolledAt().AsTime()
	ctrs := m.containersOf(t, p)
	if len(ctrs) == 0 {
		t.Fatalf("pod %s/%s Ready with no container in its ready sandbox", p.Namespace, p.Name)
	}
	for _, c := range ctrs {
		if created := time.Unix(0, c.CreatedAt); created.Before(enrolled) {
			t.Errorf("pod %s/%s: container %s created at %s, before the pod was enrolled at %s", p.Namespace, p.Name, c.Metadata.Name, created.Format(time.RFC3339Nano), enrolled.Format(time.RFC3339Nano))
		}
	}
	return rec
}

// TestK8sNRI runs nftredird's NRI door in the real cluster: containerd
// 2.4 whose validator requires the plugin, no nftredir-cni in the chain.
func TestK8sNRI(t *testing.T) {
	m := startNRIMesh(t, kcluster.NRIOptions{}, daemonOpts{})
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	m.CreateNamespace(t, "open", nil)
	gate := filepath.Join(m.dir, "nri-gate")
	if b, err := os.ReadFile(gate); err != nil || !strings.Contains(string(b), "containerd v2.4") {
		t.Fatalf("gate file %s: %q %v; want it written once registered with containerd 2.4", gate, b, err)
	}

	t.Run("captured at RunPodSandbox, a pod outside the mesh left alone, no exec", func(t *testing.T) {
		web := m.runPod(t, "mesh", "web")
		m.wantCapturedBeforeContainers(t, web)
		plain := m.runPod(t, "open", "plain")
		if rec := m.enrolled(t, plain.UID); rec != nil {
			t.Errorf("open/plain enrolled: %v", rec)
		}
		wantDirect(t, m.answer(t, plain), "plain")
	})

	t.Run("a burst of sandboxes: each handled within the request timeout, captured before its containers", func(t *testing.T) {
		// The runtime hands sandboxes to NRI plugins one at a time,
		// node-wide: a burst queues at the plugin, and a handler that
		// outlived the request timeout would get it disconnected (and
		// a new Synchronize logged).
		const n = 16
		syncs := strings.Count(m.daemonLog(100000), "Synchronize: every pod in line")
		var pods []*corev1.Pod
		for i := range n {
			ns := "mesh"
			if i%2 == 1 {
				ns = "open"
			}
			pods = append(pods, m.createPod(t, ns, fmt.Sprintf("rush-%d", i)))
		}
		uids := map[string]bool{}
		for _, p := range pods {
			p = m.WaitPodReady(t, p.Namespace, p.Name)
			uids[string(p.UID)] = true
			if p.Namespace == "mesh" {
				m.wantEnrolledBeforeContainers(t, p)
			} else if rec := m.enrolled(t, p.UID); rec != nil {
				t.Errorf("%s/%s enrolled: %v", p.Namespace, p.Name, rec)
			}
		}
		log := m.daemonLog(100000)
		if now := strings.Count(log, "Synchronize: every pod in line"); now != syncs {
			t.Errorf("%d Synchronize during the burst: the plugin was disconnected", now-syncs)
		}
		took := handlerTimes(t, log, "RunPodSandbox", uids)
		if len(took) != n {
			t.Errorf("%d RunPodSandbox in the daemon's log for the %d pods; want one each", len(took), n)
		}
		slices.Sort(took)
		if len(took) > 0 {
			t.Logf("%d pods (%d in the mesh) created at once: RunPodSandbox handled in p50 %s, max %s", n, n/2, took[len(took)/2].Round(time.Microsecond), took[len(took)-1].Round(time.Microsecond))
		}
	})

	t.Run("daemon killed and kept down: no container starts; captured by Synchronize once back", func(t *testing.T) {
		m.daemon.kill(t)
		down := true
		defer func() {
			if down {
				m.daemon.start(t)
			}
		}()
		held := m.createPod(t, "mesh", "held")
		plain := m.createPod(t, "open", "plain-down")
		// The validator is node-wide: a pod the policy leaves alone waits
		// too (docs/blast-radius.md).
		for _, p := range []*corev1.Pod{held, plain} {
			m.WaitPod(t, p.Namespace, p.Name, kcluster.DefaultTimeout, "refused by the NRI validator", refusedByValidator)
		}
		time.Sleep(5 * time.Second)
		for _, p := range []*corev1.Pod{held, plain} {
			if n := len(m.containersOf(t, p)); n != 0 {
				t.Fatalf("pod %s/%s has %d containers while nftredird is down", p.Namespace, p.Name, n)
			}
		}

		m.daemon.start(t)
		down = false
		back := time.Now()
		// The node proxy's first snapshot, right after the daemon
		// serves: Synchronize has captured the held pod by then.
		peer := zdstest.Dial(t, m.zds)
		snap := peer.Handshake()
		if !slices.ContainsFunc(snap, func(r zdstest.Request) bool { return r.Kind == zdstest.Add && r.UID == string(held.UID) }) {
			t.Errorf("the node proxy's first snapshot %v lacks mesh/held", snap)
		}
		heldReady := m.WaitPodReady(t, "mesh", "held")
		took := time.Since(back)
		m.wantCapturedBeforeContainers(t, heldReady)
		plainReady := m.WaitPodReady(t, "open", "plain-down")
		wantDirect(t, m.answer(t, plainReady), "plain-down")
		t.Logf("nftredird down: mesh/held and open/plain-down refused by the validator; mesh/held Ready and captured %s after nftredird was back (serving)", took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("mesh/held took %s after nftredird's return to start; want at most 10s", took.Round(time.Millisecond))
		}
	})

	t.Run("containerd restarts: the plugin connects again", func(t *testing.T) {
		m.RestartContainerd(t)
		// Made at once: whether its sandbox comes before the plugin is
		// back (Synchronize) or after (RunPodSandbox), it is captured
		// before any container.
		m.createPod(t, "mesh", "after-restart")
		p := m.WaitPodReady(t, "mesh", "after-restart")
		m.wantCapturedBeforeContainers(t, p)
	})

	t.Run("a full Synchronize: pods started while the daemon was down", func(t *testing.T) {
		const n = 20
		m.daemon.kill(t)
		down := true
		defer func() {
			if down {
				m.daemon.start(t)
			}
		}()
		var pods []*corev1.Pod
		for i := range n {
			ns := "mesh"
			if i%2 == 1 {
				ns = "open"
			}
			pods = append(pods, m.createPod(t, ns, fmt.Sprintf("burst-%d", i)))
		}
		for _, p := range pods {
			m.WaitPod(t, p.Namespace, p.Name, kcluster.DefaultTimeout, "refused by the NRI validator", refusedByValidator)
		}
		m.daemon.start(t)
		down = false
		back := time.Now()
		for _, p := range pods {
			p = m.WaitPodReady(t, p.Namespace, p.Name)
			if p.Namespace == "mesh" {
				m.wantCapturedBeforeContainers(t, p)
			} else if rec := m.enrolled(t, p.UID); rec != nil {
				t.Errorf("%s/%s enrolled: %v", p.Namespace, p.Name, rec)
			}
		}
		var sync string
		for _, l := range strings.Split(m.daemonLog(3000), "\n") {
			if strings.Contains(l, "Synchronize: every pod in line") {
				sync = l
			}
		}
		t.Logf("%d pods (%d in the mesh) held while nftredird was down, all Ready %s after it was back; its Synchronize: %s", n, n/2, time.Since(back).Round(time.Millisecond), sync)
	})

	t.Run("released at StopPodSandbox", func(t *testing.T) {
		p := m.runPod(t, "mesh", "gone")
		rec := m.enrolled(t, p.UID)
		if rec == nil {
			t.Fatal("mesh/gone not enrolled")
		}
		if err := m.Client.CoreV1().Pods("mesh").Delete(t.Context(), "gone", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		m.waitEnrolled(t, p.UID, false)
	})
}

// TestK8sNRISlowHook: a RunPodSandbox that outlives the runtime's request
// timeout does not let the pod run uncaptured. containerd 2.4 (NRI 0.12.3)
// lets the sandbox proceed and disconnects the plugin; the validator then
// refuses the pod's containers until the plugin is back and its
// Synchronize has captured the pod.
func TestK8sNRISlowHook(t *testing.T) {
	m := startNRIMesh(t, kcluster.NRIOptions{RequestTimeout: time.Second}, daemonOpts{
		daemon: testHookDaemon(t),
		env:    []string{"NFTREDIR_TEST_NRI_DELAY=1500ms"},
	})
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	start := time.Now()
	m.createPod(t, "mesh", "slow")
	p := m.WaitPodReady(t, "mesh", "slow")
	m.wantCapturedBeforeContainers(t, p)
	if n := strings.Count(m.daemonLog(5000), "Synchronize: every pod in line"); n < 2 {
		t.Errorf("%d Synchronize in the daemon's log; want a second one, after the slow hook got the plugin disconnected", n)
	}
	t.Logf("mesh/slow Ready and captured %s after its creation, its RunPodSandbox held 1.5s against a 1s timeout", time.Since(start).Round(time.Millisecond))
}

// TestK8sChartNRI installs the chart with enrolment.via nri on a node
// whose containerd requires the plugin: the DaemonSet's own pod starts
// (it carries the validator's tolerate annotation), the install step
// takes nftredir-cni out of the network once the daemon has written its
// gate file, and a mesh pod is captured with no plugin in the chain.
func TestK8sChartNRI(t *testing.T) {
	c := startClusterWith(t, kcluster.Options{NRI: kcluster.NRIOptions{Validator: nriValidator()}})
	h := newDSHost(t, c)
	values := nriChartValues(t, c)
	// No node probe table: the test's root dial from the node is then
	// captured like any client's.
	values["kubeletUID"] = nil
	ci := installChart(t, c, h, values)
	waitNRIDoor(t, c, h)
	t.Logf("DaemonSet pod Ready %s after helm install; the install step took nftredir-cni out of the network once the daemon registered", ci.Took.Round(time.Millisecond))
	m := &meshCluster{Cluster: c, api: ci.API}
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	p := m.CreatePod(t, m.StandinPod(t, "mesh", "web", 0, m.NodeName, "app", "-port", "8080", "-name", "web"))
	p = m.WaitPodReady(t, p.Namespace, p.Name)
	m.wantCapturedBeforeContainers(t, p)
}
