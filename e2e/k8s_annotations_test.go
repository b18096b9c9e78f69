package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// inPod is a captured pod's namespace with the stand-in proxy listening in
// it, as ztunnel would through the fd it gets over ZDS, and the recorder
// that says which listener answered.
type inPod struct {
	ns  *nstest.Netns
	rec *nstest.Recorder
}

func (m *meshCluster) proxyInPod(t *testing.T, rec *nftredirv1.Pod) *inPod {
	t.Helper()
	p := &inPod{ns: &nstest.Netns{Name: filepath.Base(rec.GetNetnsPath()), Path: rec.GetNetnsPath()}, rec: nstest.NewRecorder()}
	nstest.StartProxy(t, p.ns, p.rec, nstest.DefaultProxyPorts)
	return p
}

// from dials d from inside the pod and returns who answered.
func (p *inPod) from(t *testing.T, d nstest.Dial) nstest.Record {
	t.Helper()
	r, err := p.ns.Exchange(p.rec, d)
	if err != nil {
		t.Fatalf("from the pod, %s %s: %v", d.Network, d.To, err)
	}
	return r
}

// annotationStays checks, for a while, that the pod's redirection
// annotation is still value.
func (m *meshCluster) annotationStays(t *testing.T, ns, name, value string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		p, err := m.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := p.Annotations[kube.RedirectionAnnotation]; got != value || !ok {
			t.Fatalf("pod %s/%s: %s is %q (present %v); want %q, untouched\n%s", ns, name, kube.RedirectionAnnotation, got, ok, value, m.daemon.tailLog(30))
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestK8sAnnotations holds the annotation contract and Istio's per-pod
// annotations to a real API server, kubelet and kernel: nftredir writes
// ambient.istio.io/redirection only on pods it captured, "pending" until
// the proxy acks over ZDS, and never touches anyone else's; Istio's
// dns-capture default and bypass-inbound-capture change what real
// traffic does.
func TestK8sAnnotations(t *testing.T) {
	m := startMeshCluster(t)
	m.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
	m.CreateNamespace(t, "other", nil)
	enabled := map[string]string{kube.RedirectionAnnotation: redirectionEnabled}

	t.Run("an annotation nftredir did not write is never touched", func(t *testing.T) {
		// As istio-cni leaves its pods: annotated enabled. Neither is
		// captured by nftredir: one is in an unlabelled namespace, one
		// opts out in a labelled one.
		foreign := m.runPod(t, "other", "foreign", withAnnotations(enabled))
		optOut := m.runPod(t, "mesh", "opted-out", withAnnotations(enabled), withLabels(map[string]string{meshLabel: "none"}))
		for _, p := range []*corev1.Pod{foreign, optOut} {
			if rec := m.enrolled(t, p.UID); rec != nil {
				t.Fatalf("pod %s/%s captured: %v", p.Namespace, p.Name, rec)
			}
		}
		// A restart syncs every pod before SERVING; a label change syncs
		// the pod again; the sweep would too.
		m.daemon.stop(t)
		m.daemon.start(t)
		patch := []byte(`{"metadata":{"labels":{"touched":"yes"}}}`)
		for _, p := range []*corev1.Pod{foreign, optOut} {
			if _, err := m.Client.CoreV1().Pods(p.Namespace).Patch(t.Context(), p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []*corev1.Pod{foreign, optOut} {
			m.annotationStays(t, p.Namespace, p.Name, redirectionEnabled, 3*time.Second)
		}
	})

	t.Run("a pod created again under the name is not the annotated one", func(t *testing.T) {
		// A StatefulSet's web-0 deleted and created again while the
		// agent's cache still holds the first: the patch must not reach
		// the successor. Bound to a node that does not exist, neither pod
		// ever runs (and the second could be on any node).
		pod := func() *corev1.Pod {
			p := m.StandinPod(t, "mesh", "web-0", 0, "elsewhere", "app")
			return m.CreatePod(t, p)
		}
		first := pod()
		zero := int64(0)
		if err := m.Client.CoreV1().Pods("mesh").Delete(t.Context(), "web-0", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := m.Client.CoreV1().Pods("mesh").Get(t.Context(), "web-0", metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("web-0 not deleted")
			}
			time.Sleep(50 * time.Millisecond)
		}
		second := pod()
		if second.UID == first.UID {
			t.Fatal("the pod created again has the first one's uid")
		}
		t.Cleanup(func() {
			m.Client.CoreV1().Pods("mesh").Delete(context.Background(), "web-0", metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		annotation := func() (string, bool) {
			p, err := m.Client.CoreV1().Pods("mesh").Get(t.Context(), "web-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v, ok := p.Annotations[kube.RedirectionAnnotation]
			return v, ok
		}
		if written, err := kube.SetRedirection(t.Context(), m.Client, first, redirectionEnabled); err != nil || written {
			t.Errorf("annotating the deleted pod: written %v, %v; want neither", written, err)
		}
		if v, ok := annotation(); ok {
			t.Fatalf("the successor was annotated %q through its predecessor", v)
		}
		// The successor annotated by someone else keeps it.
		set := []byte(`{"metadata":{"annotations":{"` + kube.RedirectionAnnotation + `":"enabled"}}}`)
		if _, err := m.Client.CoreV1().Pods("mesh").Patch(t.Context(), "web-0", types.MergePatchType, set, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if written, err := kube.SetRedirection(t.Context(), m.Client, first, ""); err != nil || written {
			t.Errorf("removing the deleted pod's annotation: written %v, %v; want neither", written, err)
		}
		if v, ok := annotation(); !ok || v != redirectionEnabled {
			t.Fatalf("the successor's annotation removed through its predecessor: %q (present %v)", v, ok)
		}
		// The pod itself is annotated as before.
		if written, err := kube.SetRedirection(t.Context(), m.Client, second, redirectionPending); err != nil || !written {
			t.Fatalf("annotating the pod itself: written %v, %v", written, err)
		}
		if v, _ := annotation(); v != redirectionPending {
			t.Errorf("annotation %q; want %q", v, redirectionPending)
		}
	})

	var web *corev1.Pod
	var webRec *nftredirv1.Pod
	t.Run("pending until the proxy acks, then enabled, never back", func(t *testing.T) {
		web = m.runPod(t, "mesh", "web")
		webRec = m.waitEnrolled(t, web.UID, true)
		m.waitAnnotation(t, web, redirectionPending)
		m.annotationStays(t, "mesh", "web", redirectionPending, 2*time.Second)

		peer := zdstest.Dial(t, m.zds)
		start := time.Now()
		peer.Handshake()
		m.waitAnnotation(t, web, redirectionEnabled)
		t.Logf("annotation enabled %s after the proxy acked its snapshot", time.Since(start).Round(time.Millisecond))
		peer.Close()
		m.annotationStays(t, "mesh", "web", redirectionEnabled, 2*time.Second)
	})

	t.Run("DNS is captured by default in Kubernetes mode", func(t *testing.T) {
		if webRec == nil {
			t.Skip("needs the previous subtest's pod")
		}
		if !webRec.GetOptions().GetDnsCapture() {
			t.Fatalf("pod enrolled with DNS capture off: %v", webRec.GetOptions())
		}
		p := m.proxyInPod(t, webRec)
		// Any resolver: the pod's queries land on the proxy's DNS port.
		resolver := netip.MustParseAddrPort("10.10.2.10:53")
		for _, network := range []string{"udp4", "tcp4"} {
			r := p.from(t, nstest.Dial{Network: network, To: resolver})
			if r.Listener != nstest.ProxyDNS {
				t.Errorf("%s to %s answered by %s; want the proxy's DNS listener (:%d)", network, resolver, r, defaults.DNSPort)
			}
			t.Logf("%s from the pod to %s: %s", network, resolver, r)
		}
	})

	t.Run("bypass-inbound-capture: inbound reaches the app, outbound is captured", func(t *testing.T) {
		p := m.runPod(t, "mesh", "gateway", withAnnotations(map[string]string{kube.AnnotationIstioBypassInbound: "true"}))
		rec := m.waitEnrolled(t, p.UID, true)
		if rec.GetOptions().GetInboundCapture() {
			t.Fatalf("enrolled with inbound capture on: %v", rec.GetOptions())
		}
		in := m.proxyInPod(t, rec)
		wantDirect(t, m.answer(t, p), "gateway")
		out := netip.AddrPortFrom(mustAddr(t, "10.10.0.2"), 9)
		r := in.from(t, nstest.Dial{Network: "tcp4", To: out})
		if r.Listener != nstest.ProxyOutbound || r.OrigDst != out {
			t.Errorf("from the pod to %s: %s; want the proxy's outbound listener with that original destination", out, r)
		}
		t.Logf("node -> gateway:8080 answered by the app; gateway -> %s: %s", out, r)

		// The annotation gone, inbound is captured again.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, kube.AnnotationIstioBypassInbound)
		if _, err := m.Client.CoreV1().Pods("mesh").Patch(t.Context(), "gateway", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(followTimeout)
		for m.enrolled(t, p.UID).GetOptions().GetInboundCapture() == false {
			if time.Now().After(deadline) {
				t.Fatal("the annotation's removal was not applied")
			}
			time.Sleep(100 * time.Millisecond)
		}
		wantCaptured(t, m.answer(t, p), "gateway")
	})

	t.Run("releasing the pod removes the annotation it wrote", func(t *testing.T) {
		if web == nil {
			t.Skip("needs the earlier subtest's pod")
		}
		m.label(t, "namespace", "", "mesh", "")
		m.waitEnrolled(t, web.UID, false)
		m.waitAnnotation(t, web, "")
		// Someone else's annotation on the opted-out pod is still there.
		m.annotationStays(t, "mesh", "opted-out", redirectionEnabled, time.Second)
	})
}
