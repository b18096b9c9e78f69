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

	"github.com/nftredir/nftredir/internal/istiotest"
	"github.com/nftredir/nftredir/internal/nstest"
)

// istioMesh is a meshCluster with stock istiod and ztunnel: ztunnel is
// nftredird's ZDS peer, istiod its control plane.
type istioMesh struct {
	*meshCluster
	istiod  *istiotest.Istiod
	ztunnel *istiotest.Ztunnel
}

func startIstioMesh(t *testing.T) *istioMesh {
	t.Helper()
	nstest.RequirePrivileged(t)
	if os.Getenv(skipK8sEnv) == "1" {
		t.Skipf("Istio suite skipped because %s=1", skipK8sEnv)
	}
	bins := istiotest.Require(t)
	m := startMeshCluster(t)
	im := &istioMesh{meshCluster: m}
	im.istiod = istiotest.StartIstiod(t, m.Cluster, bins)
	im.ztunnel = istiotest.StartZtunnel(t, m.Cluster, bins, im.istiod, m.zds)
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

// TestIstioAmbientMesh runs a real ambient mesh on nftredir: stock istiod
// issues the identities and pushes Services and policy, stock ztunnel gets
// the pods from nftredird over ZDS and carries their traffic as HBONE.
func TestIstioAmbientMesh(t *testing.T) {
	im := startIstioMesh(t)
	const ns = "mesh"
	im.CreateNamespace(t, ns, map[string]string{meshLabel: meshEnabled})
	im.CreateNamespace(t, "outside", nil)
	for _, sa := range []string{"client-sa", "server-sa", "other-sa"} {
		if _, err := im.Client.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	withSA := func(sa string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.ServiceAccountName = sa }
	}
	server := im.runPod(t, ns, "server", withSA("server-sa"), withLabels(map[string]string{"app": "server"}))
	client := im.runPod(t, ns, "client", withSA("client-sa"))
	other := im.runPod(t, ns, "other", withSA("other-sa"))
	outsider := im.runPod(t, "outside", "outsider")
	for _, p := range []*corev1.Pod{server, client, other} {
		im.waitEnrolled(t, p.UID, true)
		im.waitAnnotation(t, p, redirectionEnabled)
	}
	clientNS, otherNS, outsiderNS := im.podNetns(t, client), im.podNetns(t, other), im.podNetns(t, outsider)
	serverAddr := netip.AddrPortFrom(netip.MustParseAddr(server.Status.PodIP), 8080).String()
	clientID, serverID, otherID := istiotest.SPIFFE(ns, "client-sa"), istiotest.SPIFFE(ns, "server-sa"), istiotest.SPIFFE(ns, "other-sa")

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
		// There is no kube-proxy: only ztunnel knows where the VIP goes.
		vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80).String()
		waitAnswer(t, clientNS, vip, "server")
		// The control: a pod outside the mesh has no way to the VIP.
		if got, err := exchange(outsiderNS, vip); err == nil {
			t.Errorf("a pod outside the mesh reached the VIP %s without ztunnel: %q", vip, got)
		}
		host := fmt.Sprintf("server.%s.svc.cluster.local", ns)
		line := im.ztunnel.WaitLog(t, 10*time.Second, "connection complete", host, "src.identity=", clientID, serverID)
		t.Logf("VIP %s: ztunnel: %s", vip, line)
	})

	t.Run("AuthorizationPolicy ALLOW admits its principal only", func(t *testing.T) {
		// Without a policy everyone gets through: what the policy then
		// refuses, it refuses because of the policy.
		waitAnswer(t, otherNS, serverAddr, "server")
		waitAnswer(t, outsiderNS, serverAddr, "server")
		im.ApplyYAML(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
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
`, ns, ns))
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
	if t.Failed() {
		t.Logf("ztunnel config_dump:\n%s", im.ztunnel.ConfigDump(t))
		os.Stdout.Sync()
	}
}
