package e2e

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/istiotest"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/kube"
)

// istioDoors are the ways the runtime hands new pods to nftredir, and the
// Istio suite runs on each: the chained nftredir-cni, and the runtime's
// NRI (containerd 2.4 with its validator requiring nftredir, no plugin in
// the chain).
var istioDoors = []string{defaults.EnrolmentCNI, defaults.EnrolmentNRI}

// istioMesh is a cluster with stock istiod and ztunnel and nftredir
// installed from its chart, as the README tells users: ztunnel is the
// DaemonSet daemon's ZDS peer, istiod its control plane.
type istioMesh struct {
	*meshCluster
	// door is how new pods reach nftredir: one of istioDoors.
	door    string
	chart   *chartInstall
	istiod  *istiotest.Istiod
	ztunnel *istiotest.Ztunnel
}

// startIstioMesh starts the cluster, istiod, nftredir (installChart: the
// DaemonSet from charts/nftredir, the image imported into containerd)
// enrolling new pods through door, and ztunnel as a host process on the
// node, connected to the DaemonSet's ZDS socket. Through NRI, containerd
// requires nftredir (docs/nri.md), and the mesh is up once nftredir-cni
// is out of the chain.
func startIstioMesh(t *testing.T, door string) *istioMesh {
	t.Helper()
	nstest.RequirePrivileged(t)
	if os.Getenv(skipK8sEnv) == "1" {
		t.Skipf("Istio suite skipped because %s=1", skipK8sEnv)
	}
	bins := istiotest.Require(t)
	begin := time.Now()
	var opts kcluster.Options
	var values map[string]any
	if door == defaults.EnrolmentNRI {
		opts.NRI.Validator = nriValidator()
	}
	c := startClusterWith(t, opts)
	if door == defaults.EnrolmentNRI {
		values = nriChartValues(t, c)
	}
	im := &istioMesh{door: door, istiod: istiotest.StartIstiod(t, c, bins)}
	h := newDSHost(t, c)
	im.chart = installChart(t, c, h, withProxy(values))
	t.Logf("nftredir DaemonSet pod %s Ready %s after helm install", im.chart.Pod.Name, im.chart.Took.Round(time.Millisecond))
	if door == defaults.EnrolmentNRI {
		ready := time.Now()
		waitNRIDoor(t, c, h)
		t.Logf("NRI: gate file written and nftredir-cni out of the chain %s after the DaemonSet pod was Ready", time.Since(ready).Round(time.Millisecond))
	}
	im.meshCluster = &meshCluster{Cluster: c, api: im.chart.API, zds: h.zdsSocket(), cniLog: h.cniLog}
	im.ztunnel = istiotest.StartZtunnel(t, c, bins, im.istiod, h.zdsSocket())
	t.Logf("Istio mesh up in %s", time.Since(begin).Round(time.Millisecond))
	return im
}

// podNetns is a pod's network namespace: nftredir's record of it for a
// mesh pod, else the pin under /var/run/netns whose interfaces hold the
// pod's IP.
func (im *istioMesh) podNetns(t *testing.T, p *corev1.Pod) *nstest.Netns {
	t.Helper()
	if rec := im.enrolled(t, p.UID); rec != nil {
		return &nstest.Netns{Name: filepath.Base(rec.GetNetnsPath()), Path: rec.GetNetnsPath()}
	}
	pins, _ := filepath.Glob("/var/run/netns/cni-*")
	for _, pin := range pins {
		ns := &nstest.Netns{Name: filepath.Base(pin), Path: pin}
		found := false
		ns.Do(func() error {
			addrs, err := net.InterfaceAddrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == p.Status.PodIP {
					found = true
				}
			}
			return err
		})
		if found {
			return ns
		}
	}
	t.Fatalf("no network namespace holds pod %s/%s's IP %s", p.Namespace, p.Name, p.Status.PodIP)
	return nil
}

// exchange connects from inside ns to addr, as the pod's own app would,
// sends a line and returns the first line of the answer.
func exchange(ns *nstest.Netns, addr string) (string, error) {
	var line string
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintln(c, "istio-e2e")
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return strings.TrimSpace(line), err
}

// waitAnswer retries exchange until the app named app answers, for
// changes istiod pushes to ztunnel asynchronously.
func waitAnswer(t *testing.T, ns *nstest.Netns, addr, app string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := exchange(ns, addr)
		if err == nil && strings.HasPrefix(got, "answered directly by "+app+" ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("from %s to %s: answer %q, %v; want %s's", ns.Name, addr, got, err, app)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// certIdentities reads from ztunnel's config_dump the state of the
// certificate it holds per identity, and checks each one it holds: the
// leaf must verify against istiod's root (root-cert.pem of
// istio-ca-root-cert) and carry the identity as its URI SAN.
func (im *istioMesh) certIdentities(t *testing.T) (ids map[string]string, verifyErr error) {
	t.Helper()
	var dump struct {
		Certificates []struct {
			Identity string `json:"identity"`
			State    string `json:"state"`
			// pem is the PEM text, base64-encoded.
			CertChain []struct {
				PEM []byte `json:"pem"`
			} `json:"certChain"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal(im.ztunnel.ConfigDump(t), &dump); err != nil {
		t.Fatalf("ztunnel config_dump: %v", err)
	}
	root, err := os.ReadFile(im.istiod.RootCert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(root) {
		t.Fatalf("no certificate in istiod's root %s", im.istiod.RootCert)
	}
	ids = map[string]string{}
	for _, c := range dump.Certificates {
		ids[c.Identity] = c.State
		if c.State != "Available" {
			continue
		}
		if len(c.CertChain) == 0 {
			return ids, fmt.Errorf("%s: no certificate chain", c.Identity)
		}
		block, _ := pem.Decode(c.CertChain[0].PEM)
		if block == nil {
			return ids, fmt.Errorf("%s: the leaf is not PEM", c.Identity)
		}
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return ids, fmt.Errorf("%s: %w", c.Identity, err)
		}
		inter := x509.NewCertPool()
		for _, ic := range c.CertChain[1:] {
			inter.AppendCertsFromPEM(ic.PEM)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return ids, fmt.Errorf("%s: the leaf does not verify against istiod's root: %w", c.Identity, err)
		}
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != c.Identity {
			return ids, fmt.Errorf("%s: the leaf's URI SANs are %v", c.Identity, leaf.URIs)
		}
	}
	return ids, nil
}

// TestIstioAmbientMesh runs a real ambient mesh on nftredir installed from
// its chart: stock istiod issues the identities and pushes Services and
// policy, stock ztunnel gets the pods from the DaemonSet's daemon over ZDS
// and carries their traffic as HBONE. It runs once per door (istioDoors):
// pods enrolled by the chained CNI plugin, and by the runtime's NRI. In
// each, one cluster serves every check; the restarts come last.
func TestIstioAmbientMesh(t *testing.T) {
	for _, door := range istioDoors {
		t.Run(door, func(t *testing.T) { testIstioAmbientMesh(t, door) })
	}
}

func testIstioAmbientMesh(t *testing.T, door string) {
	begin := time.Now()
	im := startIstioMesh(t, door)
	const ns = "mesh"
	im.CreateNamespace(t, ns, map[string]string{meshLabel: meshEnabled})
	im.CreateNamespace(t, "outside", nil)
	im.CreateNamespace(t, "legacy", nil)
	for _, sa := range []string{"client-sa", "server-sa", "other-sa", "bypass-sa"} {
		if _, err := im.Client.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	withSA := func(sa string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.ServiceAccountName = sa }
	}
	// Created together, so their sandboxes start side by side.
	for _, p := range []struct {
		ns, name string
		mutate   []func(*corev1.Pod)
	}{
		{ns, "server", []func(*corev1.Pod){withSA("server-sa"), withLabels(map[string]string{"app": "server"})}},
		{ns, "client", []func(*corev1.Pod){withSA("client-sa")}},
		{ns, "other", []func(*corev1.Pod){withSA("other-sa")}},
		{ns, "bypass", []func(*corev1.Pod){withSA("bypass-sa"), withAnnotations(map[string]string{kube.AnnotationIstioBypassInbound: "true"})}},
		{ns, "nodns", []func(*corev1.Pod){withSA("client-sa"), withAnnotations(map[string]string{kube.AnnotationIstioDNSCapture: "false"})}},
		{"outside", "outsider", nil},
		{"legacy", "legacy", nil},
	} {
		im.createPod(t, p.ns, p.name, p.mutate...)
	}
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"server", "client", "other", "bypass", "nodns"} {
		pods[name] = im.WaitPodReady(t, ns, name)
		im.waitEnrolled(t, pods[name].UID, true)
		im.waitAnnotation(t, pods[name], redirectionEnabled)
	}
	server, client, other := pods["server"], pods["client"], pods["other"]
	outsider := im.WaitPodReady(t, "outside", "outsider")
	legacy := im.WaitPodReady(t, "legacy", "legacy")
	clientNS, otherNS, outsiderNS := im.podNetns(t, client), im.podNetns(t, other), im.podNetns(t, outsider)
	ip := func(p *corev1.Pod) netip.Addr { return mustAddr(t, p.Status.PodIP) }
	serverAddr := netip.AddrPortFrom(ip(server), 8080).String()
	clientID, serverID, otherID := istiotest.SPIFFE(ns, "client-sa"), istiotest.SPIFFE(ns, "server-sa"), istiotest.SPIFFE(ns, "other-sa")
	t.Logf("pods Ready, enrolled and annotated %s after the test's start", time.Since(begin).Round(time.Millisecond))
	if door == defaults.EnrolmentNRI {
		// Through NRI alone: each was enrolled at its RunPodSandbox,
		// before the runtime created its containers, and nftredir-cni
		// never ran for it.
		for _, name := range []string{"server", "client", "other", "bypass", "nodns"} {
			im.wantEnrolledBeforeContainers(t, pods[name])
			wantNoCNIAdd(t, im.cniLog, pods[name])
		}
	}

	t.Run("mesh pods get istiod-issued identities", func(t *testing.T) {
		// ztunnel fetches a certificate per local workload's identity
		// from istiod once nftredir has handed it the pod; a connection
		// makes sure it is asked for, whatever its prefetch policy.
		waitAnswer(t, clientNS, serverAddr, "server")
		var ids map[string]string
		var verifyErr error
		waitUntil(t, "ztunnel to hold certificates for "+clientID+" and "+serverID, 30*time.Second, func() bool {
			ids, verifyErr = im.certIdentities(t)
			return ids[clientID] == "Available" && ids[serverID] == "Available"
		})
		if verifyErr != nil {
			t.Fatalf("ztunnel's certificates: %v", verifyErr)
		}
		t.Logf("ztunnel's certificates, each verified against istiod's root with its SPIFFE id as URI SAN: %v", ids)
	})

	t.Run("pod to pod is HBONE with both identities", func(t *testing.T) {
		waitAnswer(t, clientNS, serverAddr, "server")
		line := im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", "dst.hbone_addr=", "src.identity=", clientID, "dst.identity=", serverID)
		t.Logf("ztunnel: %s", line)
	})

	var vip netip.Addr
	t.Run("a Service VIP is reached through ztunnel", func(t *testing.T) {
		svc, err := im.Client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "server"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "server"},
				Ports:    []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vip = mustAddr(t, svc.Spec.ClusterIP)
		// There is no kube-proxy: only ztunnel knows where the VIP goes.
		to := netip.AddrPortFrom(vip, 80).String()
		waitAnswer(t, clientNS, to, "server")
		// The control: a pod outside the mesh has no way to the VIP.
		if got, err := exchange(outsiderNS, to); err == nil {
			t.Errorf("a pod outside the mesh reached the VIP %s without ztunnel: %q", to, got)
		}
		host := fmt.Sprintf("server.%s.svc.cluster.local", ns)
		line := im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", host, "src.identity=", clientID, serverID)
		t.Logf("VIP %s: ztunnel: %s", to, line)
	})

	t.Run("DNS is answered by ztunnel; ambient.istio.io/dns-capture=false leaves it alone", func(t *testing.T) {
		if !vip.IsValid() {
			t.Skip("no Service VIP")
		}
		// A resolver the pods can reach, answering every name with an
		// address of its own: whoever answers is plain to see.
		res := startNodeResolver(t, im.Cluster, netip.MustParseAddr("192.0.2.53"))
		name := fmt.Sprintf("server.%s.svc.cluster.local.", ns)
		nodnsNS := im.podNetns(t, pods["nodns"])
		got, err := queryA(nodnsNS, res.addr, name)
		if err != nil || len(got) != 1 || got[0] != res.answer {
			t.Fatalf("nodns (dns-capture=false) asking %s for %s: %v, %v; want the node resolver's %s", res.addr, name, got, err, res.answer)
		}
		t.Logf("nodns (dns-capture=false) -> %s: %s %v, from the node resolver (%d query seen there)", res.addr, name, got, res.queriesFrom(ip(pods["nodns"])))
		// The same question from a pod with Istio's default: answered
		// by ztunnel's DNS proxy, from what istiod pushed; the resolver
		// it was sent to never sees it.
		var last []netip.Addr
		waitUntil(t, "ztunnel to answer the client's query with the Service VIP", 15*time.Second, func() bool {
			last, err = queryA(clientNS, res.addr, name)
			return err == nil && len(last) == 1 && last[0] == vip
		})
		if n := res.queriesFrom(ip(client)); n != 0 {
			t.Errorf("the node resolver saw %d queries from the client, whose DNS is captured", n)
		}
		t.Logf("client (DNS captured) -> %s: %s %v = the Service VIP, answered by ztunnel (node resolver saw %d queries from the client)", res.addr, name, last, res.queriesFrom(ip(client)))
	})

	t.Run("ambient.istio.io/bypass-inbound-capture: inbound reaches the app directly, outbound is still captured", func(t *testing.T) {
		bypass := pods["bypass"]
		bypassNS := im.podNetns(t, bypass)
		// The control: without the annotation the app sees ztunnel's
		// connection (another source port), not the caller's.
		r := probeOnce(outsiderNS, ip(outsider), serverAddr, 3*time.Second)
		if !r.answeredBy("server") || r.direct() {
			t.Fatalf("outsider -> server (inbound captured, no policy yet): %v; want the server's answer through ztunnel", r)
		}
		t.Logf("outsider -> server, captured: %v", r)
		r = probeOnce(outsiderNS, ip(outsider), netip.AddrPortFrom(ip(bypass), 8080).String(), 3*time.Second)
		if !r.answeredBy("bypass") || !r.direct() {
			t.Fatalf("outsider -> bypass: %v; want the app itself, seeing the caller's own address", r)
		}
		t.Logf("outsider -> bypass, not captured: %v", r)
		r = probeOnce(bypassNS, ip(bypass), serverAddr, 3*time.Second)
		if !r.answeredBy("server") || r.direct() {
			t.Fatalf("bypass -> server: %v; want the server's answer through ztunnel", r)
		}
		line := im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", "dst.hbone_addr=", "src.identity=", istiotest.SPIFFE(ns, "bypass-sa"), "dst.identity=", serverID)
		t.Logf("bypass -> server, captured: %v; ztunnel: %s", r, line)
	})

	t.Run("legacy iptables rules in a pod: refused with an Event, the pod untouched", func(t *testing.T) {
		lns := im.podNetns(t, legacy)
		lns.Run(t, "iptables-legacy", strings.Fields(capturetest.LegacyRule)...)
		rules := lns.Run(t, "iptables-legacy", "-t", "nat", "-S")
		before := im.sandboxOf(t, legacy)
		// The namespace joins the mesh: nftredir finds the running pod
		// and must refuse it rather than stack its rules on rules it
		// can neither read nor remove.
		labelled := time.Now()
		im.label(t, "namespace", "", "legacy", meshEnabled)
		im.waitEvent(t, legacy, "CaptureRefused", "legacy iptables table nat")
		for _, e := range im.PodEvents(t, legacy.Namespace, legacy.Name) {
			if e.Reason == "CaptureRefused" {
				t.Logf("%s after the label: Event %s %s (x%d): %s", time.Since(labelled).Round(time.Millisecond), e.Type, e.Reason, e.Count, e.Message)
			}
		}
		// The daemon retries; nothing may change meanwhile.
		time.Sleep(3 * time.Second)
		if rec := im.enrolled(t, legacy.UID); rec != nil {
			t.Errorf("legacy pod enrolled: %+v", rec)
		}
		if out := lns.Run(t, "nft", "list", "tables"); strings.Contains(out, "nftredir") {
			t.Errorf("nftredir table in the refused pod:\n%s", out)
		}
		if after := lns.Run(t, "iptables-legacy", "-t", "nat", "-S"); after != rules {
			t.Errorf("legacy rules changed:\n%s\nwant:\n%s", after, rules)
		}
		p, err := im.Client.CoreV1().Pods("legacy").Get(t.Context(), "legacy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := p.Annotations[kube.RedirectionAnnotation]; ok {
			t.Errorf("refused pod annotated %s=%q", kube.RedirectionAnnotation, v)
		}
		if !kcluster.PodReady(p) {
			t.Errorf("refused pod not Ready")
		}
		im.wantUnchanged(t, legacy, before)
		line := im.answer(t, legacy)
		wantDirect(t, line, "legacy")
		t.Logf("refused pod: Ready, sandbox %v and %d restarts unchanged, no nftredir table, its rules as they were:\n%snode -> legacy:8080: %s", before.ids, before.restarts, rules, line)
	})

	policy := t.Run("AuthorizationPolicy ALLOW admits its principal only", func(t *testing.T) {
		// Without a policy everyone gets through: what the policy then
		// refuses, it refuses because of the policy.
		waitAnswer(t, otherNS, serverAddr, "server")
		waitAnswer(t, outsiderNS, serverAddr, "server")
		im.ApplyYAML(t, serverAllowsOnlyClient(ns))
		// istiod pushes the policy to ztunnel asynchronously.
		var got string
		var err error
		waitUntil(t, "the mesh pod of another identity to be refused", 30*time.Second, func() bool {
			got, err = exchange(otherNS, serverAddr)
			return err != nil
		})
		t.Logf("other-sa -> server: %q, %v", got, err)
		im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", otherID, "policy rejection")
		for i := range 3 {
			if got, err := exchange(otherNS, serverAddr); err == nil {
				t.Errorf("try %d: other-sa reached the server: %q", i, got)
			}
			if got, err := exchange(outsiderNS, serverAddr); err == nil {
				t.Errorf("try %d: the plaintext caller from outside the mesh reached the server: %q", i, got)
			} else {
				t.Logf("outsider -> server: %q, %v", got, err)
			}
			if got, err := exchange(clientNS, serverAddr); err != nil || !strings.HasPrefix(got, "answered directly by server ") {
				t.Errorf("try %d: the allowed client-sa got %q, %v; want the server's answer", i, got, err)
			}
		}
		line := im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", "src.addr="+outsider.Status.PodIP+":", "policy rejection")
		t.Logf("outsider: ztunnel: %s", line)
	})

	if door == defaults.EnrolmentNRI {
		t.Run("nftredir away: a new mesh pod waits at the validator, is captured before its containers and is in ztunnel's first snapshot", func(t *testing.T) {
			if !policy {
				t.Skip("needs the ALLOW policy")
			}
			im.awayPodWaits(t, ns, serverAddr, serverID)
		})
	}

	t.Run("nftredir and ztunnel restarted under steady connections: never uncaptured", func(t *testing.T) {
		if !policy {
			t.Skip("needs the ALLOW policy")
		}
		im.restartsKeepCapture(t, server, client, other, outsider)
	})

	t.Run("helm upgrade to another build and helm rollback under steady connections: never uncaptured", func(t *testing.T) {
		if !policy {
			t.Skip("needs the ALLOW policy")
		}
		im.upgradeKeepsCapture(t, server, client, other, outsider)
	})
	if t.Failed() {
		t.Logf("ztunnel config_dump:\n%s", im.ztunnel.ConfigDump(t))
		os.Stdout.Sync()
	}
	t.Logf("TestIstioAmbientMesh through %s took %s", door, time.Since(begin).Round(time.Millisecond))
}

// awayPodWaits makes a pod in the mesh namespace ns while nftredir's DaemonSet pod is off the
// node (NRI enrolment): containerd's validator holds its containers back
// for as long as nftredir is away; once its pod is back, the new daemon
// enrols the pod before it registers with containerd (its agent's first
// pass over the runtime's sandboxes, or Synchronize), so before the
// validator lets any of its containers start, and before it serves ZDS,
// so the pod is in ztunnel's first snapshot; ztunnel then carries its
// connection to the server (at serverAddr, identity serverID) under the
// pod's own identity.
func (im *istioMesh) awayPodWaits(t *testing.T, ns, serverAddr, serverID string) {
	t.Helper()
	const name = "away"
	var away *corev1.Pod
	var heldFor time.Duration
	im.chart.awayFromNode(t, func() {
		away = im.createPod(t, ns, name, func(p *corev1.Pod) { p.Spec.ServiceAccountName = "client-sa" })
		im.WaitPod(t, away.Namespace, name, kcluster.DefaultTimeout, "refused by the NRI validator", refusedByValidator)
		held := time.Now()
		time.Sleep(3 * time.Second)
		if n := len(im.containersOf(t, away)); n != 0 {
			t.Fatalf("pod %s has %d containers while nftredir is away", name, n)
		}
		heldFor = time.Since(held)
	})
	back := time.Now()
	snaps, sentAt := im.waitSnapshots(t, 1)
	away = im.WaitPodReady(t, away.Namespace, name)
	ready := time.Since(back)
	rec := im.wantEnrolledBeforeContainers(t, away)
	wantNoCNIAdd(t, im.cniLog, away)
	if enrolled := rec.GetEnrolledAt().AsTime(); !enrolled.Before(sentAt) {
		t.Errorf("pod %s enrolled at %s, after the new daemon's first ZDS snapshot at %s", name, enrolled.Format(time.RFC3339Nano), sentAt.Format(time.RFC3339Nano))
	}
	waitAnswer(t, im.podNetns(t, away), serverAddr, "server")
	id := istiotest.SPIFFE(away.Namespace, away.Spec.ServiceAccountName)
	line := im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", "src.addr="+away.Status.PodIP+":", "src.identity=", id, "dst.identity=", serverID)
	t.Logf("pod %s: refused by the validator, no container, for %s while nftredir was away; Ready %s after nftredir's pod was back, enrolled before its containers and before the new daemon's first snapshot; the new daemon's ZDS: %s\nztunnel: %s", name, heldFor.Round(time.Millisecond), ready.Round(time.Millisecond), snaps, line)
}

// restartsKeepCapture probes the server every 100 ms from the allowed
// client, the mesh pod of another identity and the pod outside the mesh,
// under the ALLOW policy, while the DaemonSet's pod is deleted (and comes
// back) and then ztunnel is restarted. The app names the peer it saw and
// every probe binds a source port below the pods' ephemeral range, so a
// connection that reached the app without passing ztunnel shows as the
// probe's own address: any such answer fails the test, as does any answer
// to the two callers the policy refuses.
func (im *istioMesh) restartsKeepCapture(t *testing.T, server, client, other, outsider *corev1.Pod) {
	to := netip.AddrPortFrom(mustAddr(t, server.Status.PodIP), 8080).String()
	eph := checkBelowEphemeral(t, im.podNetns(t, server))
	const every = 100 * time.Millisecond
	probers := []*prober{
		startProber(t, "client-sa -> server", im.podNetns(t, client), mustAddr(t, client.Status.PodIP), to, every),
		startProber(t, "other-sa -> server", im.podNetns(t, other), mustAddr(t, other.Status.PodIP), to, every),
		startProber(t, "outsider -> server", im.podNetns(t, outsider), mustAddr(t, outsider.Status.PodIP), to, every),
	}
	allowed := probers[0]
	answered := func(r try) bool { return r.answeredBy("server") && !r.direct() }
	refused := func(r try) bool { return r.answer == "" }
	oks := []func(try) bool{answered, refused, refused}
	// Bad: an answer that did not pass ztunnel; for the refused callers,
	// any answer at all.
	bads := []func(try) bool{func(r try) bool { return r.direct() }, func(r try) bool { return r.answer != "" }, func(r try) bool { return r.answer != "" }}
	report := func(what string, from, until time.Time) []phase {
		t.Helper()
		var out []phase
		for i, p := range probers {
			ph := summarize(p.tries(from, until), oks[i], bads[i])
			t.Logf("%s: %s: %s", what, p.name, ph)
			for _, r := range ph.bad {
				t.Errorf("%s: %s: reached the app without ztunnel's consent: %v", what, p.name, r)
			}
			out = append(out, ph)
		}
		return out
	}

	start := time.Now()
	allowed.waitRun(t, start, 10, 15*time.Second, answered)
	steady := time.Now()
	report("steady, before the restarts", start, steady)

	took := im.chart.restartPod(t)
	// Capture in the pods never depended on the daemon; ztunnel
	// reconnects to the new one and takes its snapshot.
	allowed.waitRun(t, steady.Add(took), 10, 60*time.Second, answered)
	for _, p := range []*corev1.Pod{server, client, other} {
		im.waitEnrolled(t, p.UID, true)
	}
	mid := time.Now()
	t.Logf("nftredir's DaemonSet pod deleted; %s Ready %s later; ephemeral ports of the server's namespace %s", im.chart.Pod.Name, took.Round(time.Millisecond), eph)
	snaps, _ := im.waitSnapshots(t, 1)
	t.Logf("the new daemon's ZDS: %s", snaps)
	report("nftredir pod deleted, back, 10 answers in a row", steady, mid)

	// Down for 3 s, as a replacement pod would leave the node: the
	// pods' rules then point at listeners that are gone, and every try
	// must fail rather than reach the app.
	const down = 3 * time.Second
	stopped, ready := im.ztunnel.Restart(t, down)
	allowed.waitRun(t, mid.Add(stopped+down+ready), 10, 60*time.Second, answered)
	t.Logf("ztunnel stopped in %s, none for %s, the new one ready %s later", stopped.Round(time.Millisecond), down, ready.Round(time.Millisecond))
	snaps, _ = im.waitSnapshots(t, 2)
	t.Logf("the daemon's ZDS after the restart of ztunnel: %s", snaps)
	back := time.Now()
	if phs := report("ztunnel restarted, ready, 10 answers in a row", mid, back); phs[0].failed == 0 {
		t.Errorf("%s: no failed try while ztunnel was down for %s: the probes never met the outage", allowed.name, down)
	}
	time.Sleep(2 * time.Second)
	end := time.Now()
	for _, p := range probers {
		p.stop()
	}
	report("2 s after", back, end)
	ph := summarize(allowed.tries(start, end), answered, func(try) bool { return false })
	t.Logf("whole run: %s: %s", allowed.name, ph)
	if after := summarize(allowed.tries(back, end), answered, func(try) bool { return false }); after.failed > 0 {
		t.Errorf("%s: %d failed tries after the recovery", allowed.name, after.failed)
	}
}

// upgradeKeepsCapture upgrades the chart to another build and rolls it
// back (chartUpgrade) under the ALLOW policy, with the three probe loops
// of restartsKeepCapture: the allowed client must get every answer, from
// the server's app through ztunnel, and the other identity and the
// outsider none. Pods of client-sa keep being started in the mesh
// namespace; each app's first connection, to the pod outside the mesh,
// must leave through ztunnel (the outsider's app sees ztunnel's
// connection from the pod's address, never the app's own port).
func (im *istioMesh) upgradeKeepsCapture(t *testing.T, server, client, other, outsider *corev1.Pod) {
	to := netip.AddrPortFrom(mustAddr(t, server.Status.PodIP), 8080).String()
	const every = 100 * time.Millisecond
	answered := func(r try) bool { return r.answeredBy("server") && !r.direct() }
	refused := func(r try) bool { return r.answer == "" }
	anyAnswer := func(r try) bool { return r.answer != "" }
	allowed := startProber(t, "client-sa -> server", im.podNetns(t, client), mustAddr(t, client.Status.PodIP), to, every)
	template := im.StandinPod(t, server.Namespace, "template", 0, im.NodeName, "app")
	template.Spec.ServiceAccountName = "client-sa"
	u := &chartUpgrade{
		m: im.meshCluster, chart: im.chart,
		template:    template,
		firstTarget: netip.AddrPortFrom(mustAddr(t, outsider.Status.PodIP), 8080).String(),
		firstThrough: func(r try) bool {
			return r.answeredBy(outsider.Name) && !r.direct()
		},
		flows: []upgradeFlow{
			{allowed, answered, try.direct},
			{startProber(t, "other-sa -> server", im.podNetns(t, other), mustAddr(t, other.Status.PodIP), to, every), refused, anyAnswer},
			{startProber(t, "outsider -> server", im.podNetns(t, outsider), mustAddr(t, outsider.Status.PodIP), to, every), refused, anyAnswer},
		},
		steady:    []*corev1.Pod{server, client, other, outsider},
		annotated: []*corev1.Pod{server, client, other},
		annos:     watchRedirection(t, im.Cluster, []*corev1.Pod{server, client, other}),
		viaNRI:    im.door == defaults.EnrolmentNRI,
	}
	allowed.waitRun(t, time.Now(), 10, 30*time.Second, answered)
	u.upgradeAndRollBack(t)
	for _, f := range u.flows {
		f.p.stop()
	}
}

// waitSnapshots waits until the DaemonSet's current daemon has sent n ZDS
// snapshots (one per ztunnel connection), the last one holding every pod
// it had enrolled when it sent it, and returns its log lines about them
// and when it sent the last one. A pod enrolled after the snapshot
// reaches the proxy as an update of its own.
func (im *istioMesh) waitSnapshots(t *testing.T, n int) (string, time.Time) {
	t.Helper()
	var lines []string
	var want int
	var problem error
	var last struct {
		At   time.Time `json:"@timestamp"`
		Pods int       `json:"pods"`
	}
	waitUntil(t, fmt.Sprintf("%d ZDS snapshots from %s", n, im.chart.Pod.Name), 30*time.Second, func() bool {
		lines = nil
		var sent []string
		for _, l := range strings.Split(im.PodLogs(t, dsNamespace, im.chart.Pod.Name, "nftredird"), "\n") {
			if strings.Contains(l, "node proxy connected") || strings.Contains(l, "snapshot sent") {
				lines = append(lines, l)
			}
			if strings.Contains(l, "snapshot sent") {
				sent = append(sent, l)
			}
		}
		if len(sent) < n {
			return false
		}
		if problem = json.Unmarshal([]byte(sent[len(sent)-1]), &last); problem != nil {
			return true
		}
		pods, err := im.api.ListPods(t.Context())
		if err != nil {
			return false
		}
		want = 0
		for _, p := range pods {
			if p.GetEnrolledAt().AsTime().Before(last.At) {
				want++
			}
		}
		return last.Pods == want
	})
	if problem != nil {
		t.Fatalf("the last snapshot's log line: %v\n%s", problem, strings.Join(lines, "\n"))
	}
	return fmt.Sprintf("%d pods enrolled when the last snapshot was sent; log:\n%s", want, strings.Join(lines, "\n")), last.At
}

// serverAllowsOnlyClient is the suites' L4 policy: in namespace ns, the
// pods labelled app=server admit client-sa's principal and no one else.
func serverAllowsOnlyClient(ns string) string {
	return fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: server-allow-client
  namespace: %s
spec:
  selector:
    matchLabels:
      app: server
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/%s/sa/client-sa"]
`, ns, ns)
}
