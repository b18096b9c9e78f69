package e2e

import (
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/kube"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestK8sReadinessTaint: a node registers with nftredir's readiness taint,
// as a node pool's startup taint. A mesh pod created before nftredir runs
// there (no nodeName: the scheduler places it) stays unscheduled until the
// DaemonSet's daemon, serving with the plugin chained, removes the taint;
// then it starts, captured.
func TestK8sReadinessTaint(t *testing.T) {
	img, bin := buildImage(t)
	taint := kube.DefaultReadinessTaint + ":NoSchedule"
	c := startClusterWith(t, kcluster.Options{RegisterWithTaints: []string{taint}})
	c.ImportImage(t, img.tarball)
	hasTaint := func() bool {
		n, err := c.Client.CoreV1().Nodes().Get(t.Context(), c.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool {
			return x.Key == kube.DefaultReadinessTaint && x.Effect == corev1.TaintEffectNoSchedule
		})
	}
	if !hasTaint() {
		t.Fatalf("node %s registered without %s", c.NodeName, taint)
	}
	h := newDSHost(t, c)

	c.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	c.CreatePod(t, c.StandinPod(t, "mesh", "early", 0, "", "app", "-port", "8080", "-name", "early"))
	time.Sleep(3 * time.Second)
	p, err := c.Client.CoreV1().Pods("mesh").Get(t.Context(), "early", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Fatalf("mesh/early scheduled to %s while the node has %s", p.Spec.NodeName, taint)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			t.Logf("mesh/early before nftredir: PodScheduled=%s %s: %s", cond.Status, cond.Reason, cond.Message)
		}
	}

	// As docs/deploy.md: the namespace at the privileged Pod Security
	// level, then helm install with the chart's default readinessTaint.
	c.CreateNamespace(t, dsNamespace, map[string]string{"pod-security.kubernetes.io/enforce": "privileged"})
	values := writeDSValues(t, c, h)
	applied := time.Now()
	helm(t, c, "install", dsRelease, filepath.Join(bin.Repo, "charts", "nftredir"), "--namespace", dsNamespace, "-f", values)
	// The pod is read before the node: the taint is never put back, so a
	// pod found bound while the node, read after, still has the taint
	// was placed on a tainted node.
	var untainted, scheduled time.Duration
	deadline := time.Now().Add(2 * kcluster.DefaultTimeout)
	for scheduled == 0 || untainted == 0 {
		p, err = c.Client.CoreV1().Pods("mesh").Get(t.Context(), "early", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tainted := hasTaint()
		if p.Spec.NodeName != "" && scheduled == 0 {
			scheduled = time.Since(applied)
			if tainted {
				t.Fatalf("mesh/early bound to %s while the node still had %s", p.Spec.NodeName, taint)
			}
		}
		if !tainted && untainted == 0 {
			untainted = time.Since(applied)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: taint removed after %s, pod scheduled after %s\n%s", 2*kcluster.DefaultTimeout, untainted, scheduled, dsLogs(c))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("after helm install: taint removed at +%s, mesh/early bound at +%s", untainted.Round(time.Millisecond), scheduled.Round(time.Millisecond))
	early := c.WaitPodReady(t, "mesh", "early")
	ds := waitDSPodReady(t, c)
	t.Logf("mesh/early Ready at +%s; DaemonSet pod %s Ready", time.Since(applied).Round(time.Millisecond), ds.Name)

	api, err := client.Dial(t.Context(), h.socket(), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() })
	resp, err := api.GetPod(t.Context(), string(early.UID))
	if err != nil || resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Fatalf("GetPod mesh/early: %v %v %s", err, resp.GetSyncStatus(), resp.GetDetail())
	}
	rec := nstest.NewRecorder()
	netnsPath := resp.GetPod().GetNetnsPath()
	nstest.StartProxy(t, &nstest.Netns{Name: filepath.Base(netnsPath), Path: netnsPath}, rec, nstest.DefaultProxyPorts)
	to := netip.AddrPortFrom(mustAddr(t, early.Status.PodIP), 8080)
	if r := c.Netns.DialAs(t, nstest.DialChildBinary(t), rec, dsClientUID, to); r.Listener != nstest.ProxyInbound {
		t.Fatalf("uid %d -> %s answered by %q; want the proxy (captured)", dsClientUID, to, r.Listener)
	}
	t.Logf("mesh/early captured: uid %d -> %s answered by %s", dsClientUID, to, nstest.ProxyInbound)

	if n, ok := metricValue(scrapeNode(t, c), "nftredir_readiness_taint_removals_total"); !ok || n != 1 {
		t.Errorf("nftredir_readiness_taint_removals_total = %v (present %v); want 1", n, ok)
	}
	evs, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{FieldSelector: "reason=ReadinessTaintRemoved"})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != c.NodeName {
		t.Errorf("ReadinessTaintRemoved events on node %s: %v %+v", c.NodeName, err, evs)
	} else {
		t.Logf("node event: %s %s: %s", evs.Items[0].Type, evs.Items[0].Reason, evs.Items[0].Message)
	}

	// Deleting only the DaemonSet, its RBAC still there: the daemon also
	// clears the released pod's redirection annotation.
	t.Run("delete the DaemonSet alone", func(t *testing.T) {
		// "pending": no node proxy acked it over ZDS here. The daemon
		// writes it once the ack grace has passed, so it may not be
		// there yet.
		early = c.WaitPod(t, "mesh", "early", kcluster.DefaultTimeout, kube.RedirectionAnnotation+" set", func(p *corev1.Pod) bool {
			return p.Annotations[kube.RedirectionAnnotation] != ""
		})
		t.Logf("mesh/early's %s before: %q", kube.RedirectionAnnotation, early.Annotations[kube.RedirectionAnnotation])
		c.Kubectl(t, "-n", dsNamespace, "delete", "daemonset", "nftredir", "--wait=true", "--timeout=120s")
		deadline := time.Now().Add(kcluster.DefaultTimeout)
		for len(dsAllPods(t, c)) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("DaemonSet pods still there %s after delete", kcluster.DefaultTimeout)
			}
			time.Sleep(200 * time.Millisecond)
		}
		types, _ := conflistTypes(t, c)
		if slices.Contains(types, "nftredir-cni") {
			t.Errorf("plugin still chained after the DaemonSet's deletion: %v", types)
		}
		p, err := c.Client.CoreV1().Pods("mesh").Get(t.Context(), "early", metav1.GetOptions{})
		if err != nil || p.Annotations[kube.RedirectionAnnotation] != "" {
			t.Errorf("mesh/early after: %v, annotation %q; want none", err, p.Annotations[kube.RedirectionAnnotation])
		}
		line := c.Netns.DialAsLine(t, nstest.DialChildBinary(t), dsClientUID, to)
		wantDirect(t, line, "early")
		t.Logf("DaemonSet deleted alone: plugins %v, mesh/early's annotation cleared, uid %d -> %s: %s", types, dsClientUID, to, line)
	})
}
