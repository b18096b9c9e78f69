package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nftredir/nftredir/internal/testkit/istiotest"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/kube"
)

// TestIstioMigrationFromIstioCNI moves a running ambient mesh from the
// real istio-cni to nftredir, as the README's "Migrating from istio-cni"
// tells users: stock istiod and ztunnel, istio-cni's node agent and plugin
// (built from the same Istio module), mesh pods captured by it under an
// ALLOW AuthorizationPolicy; then istio-cni's agent stopped as its
// uninstall stops it, and nftredir installed with its Helm chart (the
// DaemonSet) on the same ZDS socket, ztunnel reconnecting by itself. While
// that happens a prober dials every 100 ms as the allowed client, and two
// as callers the policy refuses, a watch follows every pod's redirection
// annotation, and the pods' network namespaces are polled for whose
// capture they hold.
func TestIstioMigrationFromIstioCNI(t *testing.T) {
	nstest.RequirePrivileged(t)
	if os.Getenv(skipK8sEnv) == "1" {
		t.Skipf("Istio suite skipped because %s=1", skipK8sEnv)
	}
	bins := istiotest.Require(t)
	cniBins := istiotest.RequireIstioCNI(t)
	// Built before the cluster starts: it takes a while, alone.
	buildImage(t)
	c := startCluster(t)
	h := newDSHost(t, c)
	// The chart's ZDS socket, which istio-cni serves first.
	zds := h.zdsSocket()

	istiod := istiotest.StartIstiod(t, c, bins)
	icni := istiotest.StartIstioCNI(t, c, cniBins, istiotest.IstioCNIOptions{ZDS: zds})
	zt := istiotest.StartZtunnel(t, c, bins, istiod, zds)

	const ns, lateNS = "mesh", "late"
	c.CreateNamespace(t, ns, map[string]string{meshLabel: meshEnabled})
	c.CreateNamespace(t, lateNS, nil)
	c.CreateNamespace(t, "outside", nil)
	for _, sa := range []string{"client-sa", "server-sa", "other-sa"} {
		if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(namespace, name, sa string, labels map[string]string) *corev1.Pod {
		p := c.StandinPod(t, namespace, name, 0, c.NodeName, "app", "-port", "8080", "-name", name)
		p.Spec.ServiceAccountName = sa
		p.Labels = labels
		c.CreatePod(t, p)
		return c.WaitPodReady(t, namespace, name)
	}
	server := run(ns, "server", "server-sa", map[string]string{"app": "server"})
	client := run(ns, "client", "client-sa", nil)
	other := run(ns, "other", "other-sa", nil)
	// Started under istio-cni, in a namespace not yet in the mesh: the
	// namespace is labelled once nftredir runs.
	late := run(lateNS, "late", "", nil)
	outsider := run("outside", "outsider", "", nil)
	mesh := []*corev1.Pod{server, client, other}

	for _, p := range mesh {
		waitRedirection(t, c, p, redirectionEnabled)
	}
	pins := map[string]*nstest.Netns{}
	for _, p := range append(slices.Clone(mesh), late, outsider) {
		pins[p.Name] = pinOf(t, p)
	}
	for _, p := range mesh {
		st := captureOf(t, pins[p.Name])
		if len(st.istio) == 0 || st.ours {
			t.Fatalf("pod %s under istio-cni: %s; want istio-cni's capture only", p.Name, st)
		}
		t.Logf("pod %s under istio-cni: %s", p.Name, st)
	}
	if st := captureOf(t, pins[late.Name]); !st.none() {
		t.Fatalf("pod %s in the unlabelled namespace: %s; want no capture", late.Name, st)
	}

	serverAddr := netip.AddrPortFrom(netip.MustParseAddr(server.Status.PodIP), 8080).String()
	c.ApplyYAML(t, serverAllowsOnlyClient(ns))
	waitUntil(t, "istio-cni's mesh to refuse other-sa at the server (the policy pushed)", 30*time.Second, func() bool {
		_, err := exchange(pins[other.Name], serverAddr)
		return err != nil
	})
	if got, err := exchange(pins[client.Name], serverAddr); err != nil || !strings.HasPrefix(got, "answered directly by server ") {
		t.Fatalf("under istio-cni the allowed client got %q, %v", got, err)
	}
	if got, err := exchange(pins[outsider.Name], serverAddr); err == nil {
		t.Fatalf("under istio-cni the outsider reached the server: %q", got)
	}
	// The method of the exactly-once check below, shown on istio-cni's
	// capture first.
	checkSeenOnce(t, zt, pins, client, server, true)

	runtimeBefore := map[string]podRuntime{}
	for _, p := range append(slices.Clone(mesh), late, outsider) {
		runtimeBefore[p.Name] = runtimeOf(t, c, p)
	}
	annos := watchRedirection(t, c, append(slices.Clone(mesh), late))

	clientIP, otherIP, outsiderIP := podIP(client), podIP(other), podIP(outsider)
	for _, p := range []*corev1.Pod{client, other, outsider} {
		checkBelowEphemeral(t, pins[p.Name])
	}
	probeStart := time.Now()
	allowed := startProber(t, "client-sa -> server", pins[client.Name], clientIP, serverAddr, 100*time.Millisecond)
	refused := []*prober{
		startProber(t, "other-sa (in the mesh, another identity) -> server", pins[other.Name], otherIP, serverAddr, 100*time.Millisecond),
		startProber(t, "outsider (plaintext, outside the mesh) -> server", pins[outsider.Name], outsiderIP, serverAddr, 100*time.Millisecond),
	}
	time.Sleep(2 * time.Second)

	// The swap. istio-cni's agent stops as its uninstall stops it: with
	// no DaemonSet it removes its conflist entry, binary and node rules,
	// and leaves the in-pod rules and ztunnel's workloads as they are.
	swapStart := time.Now()
	stopTook := icni.Stop(t)
	if src := currentConflist(t, c); strings.Contains(src, `"istio-cni"`) {
		t.Fatalf("istio-cni's entry still in the network after its agent stopped:\n%s", src)
	}
	t.Logf("istio-cni's agent stopped in %s; its entry is out of the network", stopTook.Round(time.Millisecond))
	// A mesh pod that starts between the two: no plugin is chained, so it
	// starts uncaptured, until nftredir finds it running.
	rs := c.CRI(t)
	waitUntil(t, "containerd to load the network without istio-cni", 30*time.Second, func() bool {
		src, err := kcluster.LoadedConflist(t.Context(), rs)
		return err == nil && !strings.Contains(src, `"istio-cni"`)
	})
	gap := run(ns, "gap", "client-sa", nil)
	pins[gap.Name] = pinOf(t, gap)
	if st := captureOf(t, pins[gap.Name]); !st.none() {
		t.Fatalf("pod %s started with neither agent: %s; want no capture", gap.Name, st)
	}
	t.Logf("pod %s started %s after istio-cni's stop began, uncaptured", gap.Name, time.Since(swapStart).Round(time.Millisecond))

	takeover := watchTakeOver(pins, mesh)
	installStart := time.Now()
	chart := installChart(t, c, h, withProxy)
	took := takeover.wait(t, 90*time.Second)
	allDone := time.Now()
	t.Logf("nftredir: helm install at +%s after istio-cni's stop began; DaemonSet pod %s Ready %s after helm install", installStart.Sub(swapStart).Round(time.Millisecond), chart.Pod.Name, chart.Took.Round(time.Millisecond))
	for _, p := range mesh {
		t.Logf("pod %s taken over %s after helm install began (%s)", p.Name, took[p.Name].Round(time.Millisecond), captureOf(t, pins[p.Name]))
	}
	waitUntil(t, "the pod started between the two agents to be captured by nftredir", 30*time.Second, func() bool {
		return captureOf(t, pins[gap.Name]).ours
	})
	t.Logf("pod %s captured by nftredir %s after helm install began", gap.Name, time.Since(installStart).Round(time.Millisecond))
	// Keep probing a while after the last take-over: none may fail.
	time.Sleep(5 * time.Second)
	probeEnd := time.Now()
	allowed.stop()
	for _, p := range refused {
		p.stop()
	}

	t.Run("the allowed client keeps its answers", func(t *testing.T) {
		answered := func(r try) bool { return r.answeredBy("server") && !r.direct() }
		before := summarize(allowed.tries(probeStart, swapStart), answered, try.direct)
		during := summarize(allowed.tries(swapStart, allDone), answered, try.direct)
		after := summarize(allowed.tries(allDone, probeEnd), answered, try.direct)
		t.Logf("%s: under istio-cni %s; during the swap (%s) %s; after the last take-over %s", allowed.name, before, allDone.Sub(swapStart).Round(time.Millisecond), during, after)
		if before.failed > 0 || after.failed > 0 {
			t.Errorf("failed tries outside the swap: %d before, %d after", before.failed, after.failed)
		}
		if during.run > 5 {
			t.Errorf("%d failed tries in a row during the swap; want at most 5", during.run)
		}
		for _, ph := range []phase{before, during, after} {
			if len(ph.bad) > 0 {
				t.Errorf("the server's app saw the client's own address (not through ztunnel): %v", ph.bad)
			}
		}
	})
	t.Run("no outsider ever gets through", func(t *testing.T) {
		for _, p := range refused {
			ph := summarize(p.tries(probeStart, probeEnd), func(r try) bool { return r.err != nil }, func(r try) bool { return r.answeredBy("server") })
			t.Logf("%s: %s (failed = refused, as it must be; answered: %d)", p.name, ph, len(ph.bad))
			if len(ph.bad) > 0 {
				t.Errorf("%s reached the server %d times: %v", p.name, len(ph.bad), ph.bad[0])
			}
		}
	})

	// The namespace labelled now: its running pod is enrolled.
	labelNamespace(t, c, lateNS, meshEnabled)
	labelled := time.Now()
	waitUntil(t, "the pod in the namespace labelled after the swap to be captured by nftredir", 30*time.Second, func() bool {
		return captureOf(t, pins[late.Name]).ours
	})
	t.Logf("pod %s in the namespace labelled after the swap: captured %s after the label (%s)", late.Name, time.Since(labelled).Round(time.Millisecond), captureOf(t, pins[late.Name]))
	waitRedirection(t, c, late, redirectionEnabled)

	t.Run("each connection is seen once by ztunnel", func(t *testing.T) {
		// istiod binds the ALLOW policy to every workload of its
		// namespace here (config_dump lists it on client, other and gap
		// too), so late's own connection goes out of the mesh, to the
		// outsider: ztunnel's outbound side only.
		checkSeenOnce(t, zt, pins, client, server, true)
		checkSeenOnce(t, zt, pins, other, late, true)
		checkSeenOnce(t, zt, pins, gap, late, true)
		checkSeenOnce(t, zt, pins, late, outsider, false)
	})
	t.Run("the annotation never flips off", func(t *testing.T) {
		for _, p := range mesh {
			seen := annos.values(p.Name)
			t.Logf("pod %s %s: %q", p.Name, kube.RedirectionAnnotation, seen)
			for _, v := range seen {
				if v != redirectionEnabled {
					t.Errorf("pod %s's %s was %q at some point after the watch began; want %q throughout", p.Name, kube.RedirectionAnnotation, v, redirectionEnabled)
				}
			}
		}
		t.Logf("pod %s %s: %q", late.Name, kube.RedirectionAnnotation, annos.values(late.Name))
		waitRedirection(t, c, gap, redirectionEnabled)
	})
	t.Run("no pod restarts", func(t *testing.T) {
		for _, p := range append(slices.Clone(mesh), late, outsider) {
			now := runtimeOf(t, c, p)
			if !now.equal(runtimeBefore[p.Name]) {
				t.Errorf("pod %s: before the swap %s, after %s", p.Name, runtimeBefore[p.Name], now)
			} else {
				t.Logf("pod %s: %s, unchanged", p.Name, now)
			}
		}
	})
	if t.Failed() {
		t.Logf("ztunnel config_dump:\n%s", zt.ConfigDump(t))
	}
}

// currentConflist is the node's network file as it is now.
func currentConflist(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.CNIConfDir, kcluster.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func labelNamespace(t *testing.T, c *kcluster.Cluster, name, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, meshLabel, value)
	if _, err := c.Client.CoreV1().Namespaces().Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label namespace %s: %v", name, err)
	}
}

func waitRedirection(t *testing.T, c *kcluster.Cluster, p *corev1.Pod, want string) {
	t.Helper()
	c.WaitPod(t, p.Namespace, p.Name, 30*time.Second, fmt.Sprintf("%s=%q", kube.RedirectionAnnotation, want), func(p *corev1.Pod) bool {
		return p.Annotations[kube.RedirectionAnnotation] == want
	})
}

// pinOf is the runtime's pin of the pod's network namespace: the one
// under /var/run/netns whose interfaces hold the pod's IP.
func pinOf(t *testing.T, p *corev1.Pod) *nstest.Netns {
	t.Helper()
	pins, _ := filepath.Glob("/var/run/netns/cni-*")
	var found []*nstest.Netns
	for _, pin := range pins {
		ns := &nstest.Netns{Name: filepath.Base(pin), Path: pin}
		has := false
		ns.Do(func() error {
			addrs, err := net.InterfaceAddrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == p.Status.PodIP {
					has = true
				}
			}
			return err
		})
		if has {
			found = append(found, ns)
		}
	}
	if len(found) != 1 {
		t.Fatalf("pod %s/%s's IP %s is in %d pinned namespaces, want 1", p.Namespace, p.Name, p.Status.PodIP, len(found))
	}
	return found[0]
}

// podCapture is whose capture a pod's namespace holds.
type podCapture struct {
	// istio are istio-cni's objects: its iptables-nft chains (ISTIO_*)
	// in the ip/ip6 tables, or its own inet istio-* tables.
	istio []string
	// ours: the inet nftredir table.
	ours bool
}

func (s podCapture) none() bool { return len(s.istio) == 0 && !s.ours }

func (s podCapture) String() string {
	var parts []string
	if s.ours {
		parts = append(parts, "table inet nftredir")
	}
	if len(s.istio) > 0 {
		parts = append(parts, "istio-cni's "+strings.Join(s.istio, ", "))
	}
	if len(parts) == 0 {
		return "no capture"
	}
	return strings.Join(parts, " + ")
}

func captureOf(t *testing.T, ns *nstest.Netns) podCapture {
	t.Helper()
	s, err := readCapture(ns.Path)
	if err != nil {
		t.Fatalf("%s: %v", ns.Path, err)
	}
	return s
}

// readCapture lists the namespace's tables and chains over netlink. The
// two are separate dumps, not one view: a transaction between them (the
// take-over's, which adds our table and deletes istio-cni's chains) would
// read as neither capture, or both. So the read is taken between two
// reads of the ruleset's generation, and repeated until they agree: then
// no transaction committed while it ran.
func readCapture(path string) (podCapture, error) {
	f, err := os.Open(path)
	if err != nil {
		return podCapture{}, err
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return podCapture{}, err
	}
	for range 100 {
		before, err := nftGeneration(f)
		if err != nil {
			return podCapture{}, err
		}
		s, err := readCaptureOnce(conn)
		if err != nil {
			return s, err
		}
		after, err := nftGeneration(f)
		if err != nil {
			return s, err
		}
		if before == after {
			return s, nil
		}
	}
	return podCapture{}, errors.New("the ruleset kept changing while it was read")
}

// nftGeneration is the namespace's nftables ruleset generation, which
// every committed transaction advances (NFT_MSG_GETGEN).
func nftGeneration(ns *os.File) (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns.Fd())})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		// struct nfgenmsg: family, version, res_id.
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	if len(msgs) != 1 || len(msgs[0].Data) < 4 {
		return 0, fmt.Errorf("nftables generation: %d answers", len(msgs))
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		return 0, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32(), nil
		}
	}
	if err := ad.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("nftables generation: no NFTA_GEN_ID")
}

// fromTables notes our table and istio-cni's own tables.
func (s *podCapture) fromTables(tables []*nftables.Table) {
	for _, tb := range tables {
		switch {
		case tb.Family == nftables.TableFamilyINet && tb.Name == "nftredir":
			s.ours = true
		case tb.Family == nftables.TableFamilyINet && strings.HasPrefix(tb.Name, "istio-"):
			s.istio = append(s.istio, "table inet "+tb.Name)
		}
	}
}

func readCaptureOnce(conn *nftables.Conn) (podCapture, error) {
	var s podCapture
	tables, err := conn.ListTables()
	if err != nil {
		return s, err
	}
	s.fromTables(tables)
	chains, err := conn.ListChains()
	if err != nil {
		return s, err
	}
	for _, ch := range chains {
		if ch.Table != nil && strings.HasPrefix(ch.Name, "ISTIO_") {
			fam := "ip"
			if ch.Table.Family == nftables.TableFamilyIPv6 {
				fam = "ip6"
			}
			s.istio = append(s.istio, fmt.Sprintf("%s %s %s", fam, ch.Table.Name, ch.Name))
		}
	}
	sort.Strings(s.istio)
	return s, nil
}

// takeOver polls the pods' namespaces every 20 ms from its start, noting
// when each first holds our capture and none of istio-cni's, and whether
// any was ever seen with both or with none.
type takeOver struct {
	start time.Time
	mu    sync.Mutex
	done  map[string]time.Duration
	odd   []string
	errs  []error
	want  int
	fin   chan struct{}
}

func watchTakeOver(pins map[string]*nstest.Netns, pods []*corev1.Pod) *takeOver {
	w := &takeOver{start: time.Now(), done: map[string]time.Duration{}, want: len(pods), fin: make(chan struct{})}
	go func() {
		defer close(w.fin)
		for {
			w.mu.Lock()
			n := len(w.done)
			w.mu.Unlock()
			if n == len(pods) || time.Since(w.start) > 2*time.Minute {
				return
			}
			for _, p := range pods {
				s, err := readCapture(pins[p.Name].Path)
				w.mu.Lock()
				switch {
				case err != nil:
					w.errs = append(w.errs, err)
				case s.ours && len(s.istio) == 0:
					if _, ok := w.done[p.Name]; !ok {
						w.done[p.Name] = time.Since(w.start)
					}
				case s.ours || s.none():
					w.odd = append(w.odd, fmt.Sprintf("+%s pod %s: %s", time.Since(w.start).Round(time.Millisecond), p.Name, s))
				}
				w.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

// wait waits until every pod is taken over and returns, per pod, how long
// after the watch began.
func (w *takeOver) wait(t *testing.T, timeout time.Duration) map[string]time.Duration {
	t.Helper()
	select {
	case <-w.fin:
	case <-time.After(timeout):
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) > 0 {
		t.Errorf("reading the pods' capture: %v", w.errs[0])
	}
	if len(w.odd) > 0 {
		t.Errorf("a pod was seen with both captures or with none during the take-over: %q", w.odd)
	}
	if len(w.done) < w.want {
		t.Fatalf("after %s only %d of %d pods taken over: %v", timeout, len(w.done), w.want, w.done)
	}
	return maps.Clone(w.done)
}

func podIP(p *corev1.Pod) netip.Addr { return netip.MustParseAddr(p.Status.PodIP) }

// checkSeenOnce makes one connection from src's namespace to dst's app
// and requires ztunnel's access log to show it exactly once each way: one
// outbound line (src's side, with the connection's own source address)
// and one inbound line (dst's side). Twice would be a connection captured
// twice; never, one that went around ztunnel. Nothing else may be
// connecting to dst meanwhile.
func checkSeenOnce(t *testing.T, zt *istiotest.Ztunnel, pins map[string]*nstest.Netns, src, dst *corev1.Pod, dstInMesh bool) {
	t.Helper()
	// ztunnel logs each side of a connection when it ends, the inbound
	// side up to milliseconds after the outbound one: connections made
	// just before this one may still be logging. Start from a log where
	// nothing has completed for a second.
	settled := func() int { return strings.Count(zt.Log(t), "connection complete") }
	for n, quiet, deadline := settled(), time.Now(), time.Now().Add(10*time.Second); time.Since(quiet) < time.Second && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if m := settled(); m != n {
			n, quiet = m, time.Now()
		}
	}
	before := len(zt.Log(t))
	addr := netip.AddrPortFrom(podIP(dst), 8080).String()
	r := probeOnce(pins[src.Name], podIP(src), addr, 3*time.Second)
	if !r.answeredBy(dst.Name) || dstInMesh && r.direct() {
		t.Errorf("%s -> %s: %v; want %s's answer, through ztunnel", src.Name, dst.Name, r, dst.Name)
		return
	}
	var out, in []string
	collect := func() {
		out, in = nil, nil
		for _, l := range strings.Split(zt.Log(t)[before:], "\n") {
			if !strings.Contains(l, "connection complete") {
				continue
			}
			switch {
			case strings.Contains(l, "src.addr="+r.local.String()+" "):
				out = append(out, l)
			case strings.Contains(l, `direction="inbound"`) && strings.Contains(l, "dst.hbone_addr="+addr+" "):
				in = append(in, l)
			}
		}
	}
	// ztunnel logs a connection when it ends, each side on its own.
	deadline := time.Now().Add(5 * time.Second)
	wantIn := 0
	if dstInMesh {
		wantIn = 1
	}
	for collect(); (len(out) == 0 || len(in) < wantIn) && time.Now().Before(deadline); collect() {
		time.Sleep(200 * time.Millisecond)
	}
	// A connection captured twice would log again.
	time.Sleep(time.Second)
	collect()
	if len(out) != 1 || len(in) != wantIn {
		t.Errorf("%s -> %s (%s): ztunnel logged %d outbound and %d inbound lines, want 1 and %d:\n%s\nztunnel's log since:\n%s", src.Name, dst.Name, r.local, len(out), len(in), wantIn, strings.Join(append(out, in...), "\n"), zt.Log(t)[before:])
		return
	}
	t.Logf("%s -> %s (%s) seen once by ztunnel's outbound side, %d times by its inbound side:\n%s", src.Name, dst.Name, r.local, wantIn, strings.Join(append(out, in...), "\n"))
}

// podRuntime is what a restart would change: the containers' restart
// counts and the pod's sandboxes in the runtime.
type podRuntime struct {
	restarts  int32
	sandboxes []string
}

func (r podRuntime) equal(o podRuntime) bool {
	return r.restarts == o.restarts && slices.Equal(r.sandboxes, o.sandboxes)
}

func (r podRuntime) String() string {
	return fmt.Sprintf("restarts %d, sandboxes %v", r.restarts, r.sandboxes)
}

func runtimeOf(t *testing.T, c *kcluster.Cluster, p *corev1.Pod) podRuntime {
	t.Helper()
	cur, err := c.Client.CoreV1().Pods(p.Namespace).Get(t.Context(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var r podRuntime
	for _, cs := range cur.Status.ContainerStatuses {
		r.restarts += cs.RestartCount
	}
	resp, err := c.CRI(t).ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range resp.Items {
		r.sandboxes = append(r.sandboxes, fmt.Sprintf("%.12s(%s)", sb.Id, strings.TrimPrefix(sb.State.String(), "SANDBOX_")))
	}
	sort.Strings(r.sandboxes)
	return r
}

// annoWatch records every value of the redirection annotation of the
// named pods, from a watch on the API.
type annoWatch struct {
	mu   sync.Mutex
	seen map[string][]string
}

func watchRedirection(t *testing.T, c *kcluster.Cluster, pods []*corev1.Pod) *annoWatch {
	t.Helper()
	w := &annoWatch{seen: map[string][]string{}}
	want := map[types.UID]string{}
	for _, p := range pods {
		want[p.UID] = p.Name
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	record := func(p *corev1.Pod) {
		name, ok := want[p.UID]
		if !ok {
			return
		}
		v, has := p.Annotations[kube.RedirectionAnnotation]
		if !has {
			v = "(absent)"
		}
		w.mu.Lock()
		if s := w.seen[name]; len(s) == 0 || s[len(s)-1] != v {
			w.seen[name] = append(s, v)
		}
		w.mu.Unlock()
	}
	for i := range list.Items {
		record(&list.Items[i])
	}
	rv := list.ResourceVersion
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			wi, err := c.Client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range wi.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					record(p)
					rv = p.ResourceVersion
				}
			}
			wi.Stop()
		}
	}()
	return w
}

func (w *annoWatch) values(name string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen[name])
}

// TestReadCaptureSeesOneTransactionWhole: the take-over watch must read
// a namespace as it is between transactions. A transaction that swaps
// istio-cni's chains for our table, landing between readCapture's dumps
// of tables and of chains, read as "no capture" and failed the migration
// test although the kernel never was without one.
func TestReadCaptureSeesOneTransactionWhole(t *testing.T) {
	ns := nstest.NewNetns(t)
	f, err := os.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	istio := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "mangle"}
	ours := &nftables.Table{Family: nftables.TableFamilyINet, Name: "nftredir"}
	theirs := func() {
		conn.AddTable(istio)
		conn.AddChain(&nftables.Chain{Table: istio, Name: "ISTIO_PRERT"})
	}
	theirs()
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	swaps := make(chan error, 1)
	go func() {
		// Each Flush is one transaction: one capture out, the other in.
		for i := 0; ; i++ {
			select {
			case <-stop:
				swaps <- nil
				return
			default:
			}
			if i%2 == 0 {
				conn.DelTable(istio)
				conn.AddTable(ours)
			} else {
				conn.DelTable(ours)
				theirs()
			}
			if err := conn.Flush(); err != nil {
				swaps <- err
				return
			}
		}
	}()
	var odd []string
	for range 1000 {
		s, err := readCapture(ns.Path)
		if err != nil {
			t.Error(err)
			break
		}
		if s.none() || s.ours && len(s.istio) > 0 {
			odd = append(odd, s.String())
		}
	}
	close(stop)
	if err := <-swaps; err != nil {
		t.Fatal(err)
	}
	if len(odd) > 0 {
		t.Errorf("%d of 1000 reads saw a state no transaction left: %q", len(odd), odd[:min(len(odd), 5)])
	}
}
