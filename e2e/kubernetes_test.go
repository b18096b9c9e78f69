package e2e

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// meshCluster is a real single-node cluster whose pods are chained through
// nftredir-cni to an nftredird in Kubernetes mode, running as a host
// process in the cluster's node namespace with the ServiceAccount and
// ClusterRole of charts/nftredir (templates/rbac.yaml, rendered by helm).
type meshCluster struct {
	*kcluster.Cluster
	daemon     *nftredird
	api        *client.Client
	dir        string
	kubeconfig string
	zds        string
	cniLog     string
}

const (
	meshLabel   = kube.DefaultModeLabel
	meshEnabled = kube.DefaultModeEnabled
	// How soon a label change must show in the kernel: the watch delivers
	// it within a second on an idle node.
	followTimeout = 15 * time.Second
)

func startMeshCluster(t *testing.T) *meshCluster {
	t.Helper()
	m := newMeshCluster(t)
	m.startMesh(t)
	return m
}

// newMeshCluster is the cluster with the plugin installed but not
// chained, and nftredird not started: its pods run on the bridge alone,
// as on a node before nftredir is installed. startMesh installs it.
func newMeshCluster(t *testing.T) *meshCluster {
	t.Helper()
	// Made before the cluster: cleanups run last-registered first, and the
	// cluster's teardown deletes its pods, whose CNI DELs write the
	// plugin's log here. A dir made after the cluster is removed before
	// that and recreated by the log, left behind in /tmp.
	dir := t.TempDir()
	c := startCluster(t)
	bin := binaries(t)
	c.InstallCNIPlugin(t, "nftredir-cni", bin.CNI)
	c.CreateNamespace(t, "nftredir-system", nil)
	c.ApplyYAML(t, chartRBAC(t, c))
	m := &meshCluster{Cluster: c, dir: dir, zds: filepath.Join(dir, "zds.sock"), cniLog: filepath.Join(dir, "cni.log")}
	m.kubeconfig = c.ServiceAccountKubeconfig(t, "nftredir-system", "nftredir")
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "cni.log")); err == nil {
				t.Logf("nftredir-cni log:\n%s", b)
			}
		}
	})
	return m
}

// startMesh starts nftredird in Kubernetes mode (extra flags appended)
// and chains the plugin behind the bridge.
func (m *meshCluster) startMesh(t *testing.T, args ...string) {
	t.Helper()
	m.daemon = startDaemon(t, daemonOpts{
		dir:   m.dir,
		netns: m.Netns.Path,
		args: append([]string{
			"--kubernetes", "--kubeconfig", m.kubeconfig, "--node-name", m.NodeName,
			"--kubernetes-state-dir", filepath.Join(m.dir, "seen"),
			"--zds-socket", m.zds,
		}, args...),
	})
	m.api = m.daemon.client(t)
	m.WriteConflist(t, map[string]any{
		"type":              "nftredir-cni",
		"socket":            m.daemon.socket,
		"timeout":           "10s",
		"excludeNamespaces": []string{"kube-system"},
		"logFile":           m.cniLog,
		"logLevel":          "debug",
		"dataDir":           filepath.Join(m.dir, "cni-data"),
	})
}

// runPod starts a standin app pod on the node and waits until it is Ready.
func (m *meshCluster) runPod(t *testing.T, ns, name string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p := m.createPod(t, ns, name, mutate...)
	return m.WaitPodReady(t, p.Namespace, p.Name)
}

func (m *meshCluster) createPod(t *testing.T, ns, name string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p := m.StandinPod(t, ns, name, 0, m.NodeName, "app", "-port", "8080", "-name", name)
	for _, f := range mutate {
		f(p)
	}
	return m.CreatePod(t, p)
}

// enrolled is the daemon's record of the pod, or nil.
func (m *meshCluster) enrolled(t *testing.T, uid types.UID) *nftredirv1.Pod {
	t.Helper()
	resp, err := m.api.GetPod(t.Context(), string(uid))
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("GetPod %s: %v", uid, err)
	}
	if resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Fatalf("pod %s is %v: %s", uid, resp.GetSyncStatus(), resp.GetDetail())
	}
	return resp.GetPod()
}

// waitEnrolled waits until the daemon has the pod (want) or not (!want).
func (m *meshCluster) waitEnrolled(t *testing.T, uid types.UID, want bool) *nftredirv1.Pod {
	t.Helper()
	deadline := time.Now().Add(followTimeout)
	for {
		p := m.enrolled(t, uid)
		if (p != nil) == want {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s enrolled=%v after %s, want %v\n%s", uid, p != nil, followTimeout, want, m.daemonLog(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// daemonLog is the last n lines of the host process's log, or the
// DaemonSet pods' logs when the daemon runs from the chart.
func (m *meshCluster) daemonLog(n int) string {
	if m.daemon == nil {
		return dsLogs(m.Cluster)
	}
	return m.daemon.tailLog(n)
}

// Values of the redirection annotation: with ZDS served, a captured pod
// is pending until a proxy acks it.
const (
	redirectionEnabled = "enabled"
	redirectionPending = "pending"
)

// waitAnnotation waits until the pod's redirection annotation is want, or
// gone for "".
func (m *meshCluster) waitAnnotation(t *testing.T, p *corev1.Pod, want string) {
	t.Helper()
	m.WaitPod(t, p.Namespace, p.Name, followTimeout, fmt.Sprintf("%s=%q", kube.RedirectionAnnotation, want), func(p *corev1.Pod) bool {
		v, ok := p.Annotations[kube.RedirectionAnnotation]
		return v == want && ok == (want != "")
	})
}

// answer dials the pod's port 8080 from the node namespace, as a client
// outside the pod would, and returns the first line of the answer: the
// app's "answered directly by NAME ..." when the pod is not captured, the
// stand-in proxy's listener name when it is.
func (m *meshCluster) answer(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("pod %s/%s has no IP: %q", p.Namespace, p.Name, p.Status.PodIP)
	}
	var line string
	err = m.Netns.Do(func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, 8080).String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintln(c, "k8s-e2e")
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	if err != nil {
		t.Fatalf("connect to pod %s/%s at %s:8080: %v", p.Namespace, p.Name, ip, err)
	}
	return strings.TrimSpace(line)
}

// proxyIn starts the stand-in node proxy in the pod's namespace, as
// ztunnel would through the fd it gets over ZDS.
func (m *meshCluster) proxyIn(t *testing.T, rec *nftredirv1.Pod) {
	t.Helper()
	ns := &nstest.Netns{Name: filepath.Base(rec.GetNetnsPath()), Path: rec.GetNetnsPath()}
	nstest.StartProxy(t, ns, nstest.NewRecorder(), nstest.DefaultProxyPorts)
}

func wantDirect(t *testing.T, got, app string) {
	t.Helper()
	if !strings.HasPrefix(got, "answered directly by "+app+" ") {
		t.Fatalf("connection to %s answered %q; want the app itself (not captured)", app, got)
	}
}

func wantCaptured(t *testing.T, got, app string) {
	t.Helper()
	if got != nstest.ProxyInbound {
		t.Fatalf("connection to %s answered %q; want the proxy's inbound listener (captured)", app, got)
	}
}

func withLabels(l map[string]string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Labels = l }
}

// filesUnder lists the files under dir, relative, sorted.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// recordName is the file name the state store gives a pod's record of
// any kind.
func recordName(uid types.UID) string {
	return fmt.Sprintf("%x.json", sha256.Sum256([]byte(uid)))
}

func withAnnotations(a map[string]string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Annotations = a }
}

func (m *meshCluster) label(t *testing.T, kind, ns, name, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, meshLabel, value)
	if value == "" {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, meshLabel)
	}
	var err error
	switch kind {
	case "namespace":
		_, err = m.Client.CoreV1().Namespaces().Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	case "pod":
		_, err = m.Client.CoreV1().Pods(ns).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
	if err != nil {
		t.Fatalf("label %s %s: %v", kind, name, err)
	}
}

func (m *meshCluster) hasEvent(t *testing.T, p *corev1.Pod, reason, text string) bool {
	t.Helper()
	for _, e := range m.PodEvents(t, p.Namespace, p.Name) {
		if e.Reason == reason && strings.Contains(e.Message, text) {
			return true
		}
	}
	return false
}

func (m *meshCluster) waitEvent(t *testing.T, p *corev1.Pod, reason, text string) {
	t.Helper()
	deadline := time.Now().Add(kcluster.DefaultTimeout)
	for !m.hasEvent(t, p, reason, text) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s event containing %q on pod %s/%s; events: %v", reason, text, p.Namespace, p.Name, m.PodEvents(t, p.Namespace, p.Name))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestK8sKubernetesMode runs nftredird's Kubernetes mode in a real cluster: real
// pods created by the kubelet through containerd and CNI, real TCP to
// them, labels and deletions through the API.
func TestK8sKubernetesMode(t *testing.T) {
	m := startMeshCluster(t)
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	m.CreateNamespace(t, "plain", nil)
	if _, err := m.Client.CoreV1().ServiceAccounts("mesh").Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web-sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("labelled namespace is captured with the pod's identity", func(t *testing.T) {
		p := m.runPod(t, "mesh", "web", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "web-sa" })
		rec := m.enrolled(t, p.UID)
		if rec == nil {
			t.Fatalf("pod %s in a labelled namespace is not enrolled", p.UID)
		}
		if rec.GetPodName() != "web" || rec.GetPodNamespace() != "mesh" || rec.GetServiceAccount() != "web-sa" || rec.GetPodUid() != string(p.UID) {
			t.Errorf("record identity %s/%s sa=%q uid=%s; want mesh/web sa=web-sa uid=%s", rec.GetPodNamespace(), rec.GetPodName(), rec.GetServiceAccount(), rec.GetPodUid(), p.UID)
		}
		if len(rec.GetPodIps()) == 0 || rec.GetPodIps()[0] != p.Status.PodIP {
			t.Errorf("record IPs %v, pod IP %s", rec.GetPodIps(), p.Status.PodIP)
		}
		// No proxy is connected yet: captured, not yet acked.
		m.waitAnnotation(t, p, redirectionPending)
		m.proxyIn(t, rec)
		wantCaptured(t, m.answer(t, p), "web")

		peer := zdstest.Dial(t, m.zds)
		var add *zdstest.Request
		for _, r := range peer.Handshake() {
			if r.Kind == zdstest.Add && r.UID == string(p.UID) {
				add = &r
			}
		}
		if add == nil {
			t.Fatalf("the ZDS snapshot has no add for %s", p.UID)
		}
		if add.Name != "web" || add.Namespace != "mesh" || add.ServiceAccount != "web-sa" {
			t.Errorf("ZDS add carries %s/%s sa=%q; want mesh/web sa=web-sa", add.Namespace, add.Name, add.ServiceAccount)
		}
		m.waitAnnotation(t, p, redirectionEnabled)
		peer.Close()
		t.Logf("mesh/web: uid %s, sa %s, captured, annotated, ZDS add %s/%s sa=%s", rec.GetPodUid(), rec.GetServiceAccount(), add.Namespace, add.Name, add.ServiceAccount)
	})

	t.Run("unlabelled namespace and pod opt-out are not captured", func(t *testing.T) {
		plain := m.runPod(t, "plain", "plain-app")
		optOut := m.runPod(t, "mesh", "opted-out", withLabels(map[string]string{meshLabel: "none"}))
		for _, p := range []*corev1.Pod{plain, optOut} {
			if rec := m.enrolled(t, p.UID); rec != nil {
				t.Errorf("pod %s/%s enrolled: %v", p.Namespace, p.Name, rec)
			}
			wantDirect(t, m.answer(t, p), p.Name)
			if _, ok := p.Annotations[kube.RedirectionAnnotation]; ok {
				t.Errorf("pod %s/%s annotated though not captured", p.Namespace, p.Name)
			}
		}
		// The plugin says why, from the daemon's answer.
		b, err := os.ReadFile(m.cniLog)
		if err != nil {
			t.Fatal(err)
		}
		for _, why := range []string{"neither the pod nor namespace plain is labelled istio.io/dataplane-mode=ambient", "the pod is labelled istio.io/dataplane-mode=none"} {
			if !strings.Contains(string(b), why) {
				t.Errorf("the CNI log does not say %q", why)
			}
		}
	})

	t.Run("labelling a namespace enrols its running pods, unlabelling releases them", func(t *testing.T) {
		p := m.runPod(t, "plain", "late")
		wantDirect(t, m.answer(t, p), "late")
		start := time.Now()
		m.label(t, "namespace", "", "plain", meshEnabled)
		rec := m.waitEnrolled(t, p.UID, true)
		enrolTook := time.Since(start)
		m.proxyIn(t, rec)
		wantCaptured(t, m.answer(t, p), "late")
		m.waitAnnotation(t, p, redirectionPending)
		// plain-app, from the previous subtest, is in the same namespace.
		if other, err := m.Client.CoreV1().Pods("plain").Get(t.Context(), "plain-app", metav1.GetOptions{}); err == nil {
			m.waitEnrolled(t, other.UID, true)
		}

		start = time.Now()
		m.label(t, "namespace", "", "plain", "")
		m.waitEnrolled(t, p.UID, false)
		releaseTook := time.Since(start)
		wantDirect(t, m.answer(t, p), "late")
		m.waitAnnotation(t, p, "")
		t.Logf("namespace label: enrolled in %s, released in %s", enrolTook.Round(time.Millisecond), releaseTook.Round(time.Millisecond))

		// A pod's own label does the same, and its opt-out wins over the
		// namespace's opt-in.
		m.label(t, "pod", "plain", "late", meshEnabled)
		m.waitEnrolled(t, p.UID, true)
		m.label(t, "namespace", "", "plain", meshEnabled)
		m.label(t, "pod", "plain", "late", "none")
		m.waitEnrolled(t, p.UID, false)
		m.label(t, "namespace", "", "plain", "")
	})

	t.Run("an upgrade from a daemon that kept its Kubernetes records apart loses none", func(t *testing.T) {
		// Until main fbaf3e9 the agent kept its sightings and annotation
		// marks in --kubernetes-state-dir, which startMesh still passes (as
		// an older DaemonSet does): what an older daemon left there is
		// what this start must move under --state-dir.
		web, err := m.Client.CoreV1().Pods("mesh").Get(t.Context(), "web", metav1.GetOptions{})
		if err != nil || web.Annotations[kube.RedirectionAnnotation] != redirectionEnabled {
			t.Fatalf("mesh/web is not the captured, annotated pod of the first subtest (err %v)", err)
		}
		late, err := m.Client.CoreV1().Pods("plain").Get(t.Context(), "late", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		agentDir := filepath.Join(m.daemon.stateDir, "seen")
		old := filepath.Join(m.dir, "seen")
		m.daemon.stop(t)
		before := filesUnder(t, agentDir)
		for _, f := range []string{recordName(web.UID), recordName(late.UID), filepath.Join("annotated", recordName(web.UID))} {
			if !slices.Contains(before, f) {
				t.Fatalf("the daemon keeps no %s in %s: %v", f, agentDir, before)
			}
		}
		if err := os.Rename(agentDir, old); err != nil {
			t.Fatal(err)
		}
		m.daemon.start(t)
		if _, err := os.Lstat(old); !os.IsNotExist(err) {
			t.Errorf("the old directory %s is still there: %v", old, err)
		}
		// Every sighting is where the daemon keeps it now; a mark may have
		// been settled by the start (the annotation of a pod released
		// earlier, removed), but only one whose pod carries none.
		after := filesUnder(t, agentDir)
		for _, f := range before {
			if slices.Contains(after, f) {
				continue
			}
			if !strings.HasPrefix(f, "annotated/") || f == filepath.Join("annotated", recordName(web.UID)) {
				t.Errorf("%s lost in the move: the daemon keeps %v, before it %v", f, after, before)
				continue
			}
			if f == filepath.Join("annotated", recordName(late.UID)) {
				m.waitAnnotation(t, late, "")
			}
			t.Logf("mark %s settled at start", f)
		}
		// The mark came along: releasing web removes the annotation
		// nftredir wrote, which it only does for a pod it has a mark of.
		m.label(t, "pod", "mesh", "web", "none")
		m.waitEnrolled(t, web.UID, false)
		m.waitAnnotation(t, web, "")
		t.Logf("moved %d files from %s to %s; mesh/web released with its annotation", len(before), old, agentDir)
	})

	t.Run("deleting a pod releases it", func(t *testing.T) {
		p := m.runPod(t, "mesh", "doomed")
		if m.enrolled(t, p.UID) == nil {
			t.Fatal("pod not enrolled")
		}
		m.DeletePod(t, "mesh", "doomed")
		m.WaitPodGone(t, "mesh", "doomed")
		m.waitEnrolled(t, p.UID, false)
	})

	t.Run("a pod deleted while the daemon is stopped is released on start", func(t *testing.T) {
		p := m.runPod(t, "mesh", "orphan")
		if m.enrolled(t, p.UID) == nil {
			t.Fatal("pod not enrolled")
		}
		m.daemon.stop(t)
		m.DeletePod(t, "mesh", "orphan")
		m.WaitPodGone(t, "mesh", "orphan")
		m.daemon.start(t)
		// Released before SERVING: no waiting here.
		if rec := m.enrolled(t, p.UID); rec != nil {
			t.Fatalf("pod deleted while the daemon was down is still enrolled: %v", rec)
		}
	})

	t.Run("a record whose pod is not in the API is released on start", func(t *testing.T) {
		// A record the API knows nothing of, in a namespace that is still
		// there: what a DEL that never came leaves. Standalone mode makes
		// one; Kubernetes mode must release it before SERVING.
		ns := nstest.NewNetns(t)
		kubeArgs := m.daemon.args
		m.daemon.stop(t)
		m.daemon.args = nil
		m.daemon.start(t)
		if _, err := m.api.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: "no-such-pod-uid", PodName: "ghost", PodNamespace: "mesh", NetnsPath: ns.Path}); err != nil {
			t.Fatal(err)
		}
		if st := observePod(t, ns); !st.enrolled() {
			t.Fatalf("standalone AddPod did not capture: %v", st)
		}
		m.daemon.stop(t)
		m.daemon.args = kubeArgs
		m.daemon.start(t)
		if rec := m.enrolled(t, "no-such-pod-uid"); rec != nil {
			t.Fatalf("a record whose pod is not in the API is still enrolled: %v", rec)
		}
		if st := observePod(t, ns); !st.absent() {
			t.Errorf("its namespace still has nftredir's state: %v", st)
		}
	})

	t.Run("daemon down: mesh pods wait for it, kube-system pods do not", func(t *testing.T) {
		m.daemon.stop(t)
		stopped := true
		defer func() {
			if stopped {
				m.daemon.start(t)
			}
		}()
		p := m.createPod(t, "mesh", "waiting")
		sys := m.runPod(t, "kube-system", "system-app")
		wantDirect(t, m.answer(t, sys), "system-app")
		m.waitEvent(t, p, "FailedCreatePodSandBox", "nftredir")
		if got, err := m.Client.CoreV1().Pods("mesh").Get(t.Context(), "waiting", metav1.GetOptions{}); err != nil || kcluster.PodReady(got) {
			t.Fatalf("mesh pod became Ready while the daemon was down (err %v)", err)
		}
		m.daemon.start(t)
		stopped = false
		p = m.WaitPodReady(t, "mesh", "waiting")
		rec := m.enrolled(t, p.UID)
		if rec == nil {
			t.Fatal("pod Ready but not enrolled")
		}
		m.proxyIn(t, rec)
		wantCaptured(t, m.answer(t, p), "waiting")
	})

	t.Run("a bad annotation fails the sandbox with an Event and programs nothing", func(t *testing.T) {
		p := m.createPod(t, "mesh", "misconfigured", withAnnotations(map[string]string{kube.AnnotationCaptureMode: "nat"}))
		m.waitEvent(t, p, "CaptureRefused", kube.AnnotationCaptureMode)
		m.waitEvent(t, p, "FailedCreatePodSandBox", kube.AnnotationCaptureMode)
		got, err := m.Client.CoreV1().Pods("mesh").Get(t.Context(), "misconfigured", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if kcluster.PodReady(got) || got.Status.PodIP != "" {
			t.Errorf("pod with a bad annotation started: ready=%v ip=%q", kcluster.PodReady(got), got.Status.PodIP)
		}
		if rec := m.enrolled(t, p.UID); rec != nil {
			t.Errorf("pod with a bad annotation is enrolled: %v", rec)
		}
		// Fixing the annotation lets the kubelet's next try through.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"redirect"}}}`, kube.AnnotationCaptureMode)
		if _, err := m.Client.CoreV1().Pods("mesh").Patch(t.Context(), "misconfigured", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		p = m.WaitPodReady(t, "mesh", "misconfigured")
		rec := m.enrolled(t, p.UID)
		if rec == nil || rec.GetOptions().GetCaptureMode() != nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT {
			t.Fatalf("fixed pod enrolled as %v; want REDIRECT mode", rec)
		}
	})
}
