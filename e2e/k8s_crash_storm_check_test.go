package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/nftredir/nftredir/internal/durable"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/kube"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/zds"
)

// settleAndCheck waits until the node has settled after the last restart
// (settle), then looks at everything and counts what is wrong.
func (s *storm) settleAndCheck(t *testing.T) {
	s.stopBurst()
	took, why := s.settle(t)
	if why != "" {
		s.violate("", "did not settle within "+stormSettleBound.String()+": "+why)
		t.Logf("after kill %d: not settled in %s: %s", s.kills, stormSettleBound, why)
	}
	v := s.look(t)
	found := v.violations()
	s.mu.Lock()
	s.checks++
	s.settles = append(s.settles, took)
	if at := s.launched.servingAt.Load(); at != 0 && !s.launched.first {
		s.servings = append(s.servings, time.Unix(0, at).Sub(s.launched.at))
	}
	s.mu.Unlock()
	for _, f := range found {
		s.violate(f.pod, f.what)
		t.Errorf("after kill %d: %s: %s", s.kills, f.pod, f.what)
	}
	captured := 0
	for _, p := range v.pods {
		if v.capturable(&p) {
			captured++
		}
	}
	t.Logf("after kill %d: settled %s after the start (%d pods, %d captured), %d violations", s.kills, took.Round(time.Millisecond), len(v.pods), captured, len(found))
	if len(found) > 0 && s.diagnosed < 5 {
		s.diagnosed++
		t.Logf("nftredird log after kill %d:\n%s", s.kills, s.m.daemon.tailLog(120))
	}
}

// settle waits until the node has settled after the daemon's last start,
// and returns how long that took from the start (to the beginning of the
// quiet period below), or why it did not settle within stormSettleBound.
// Settled means, all at once:
//
//  1. the daemon answers gRPC health SERVING: its startup reconcile and
//     the Kubernetes agent's first pass over every pod are done;
//  2. /readyz answers 200: no selected pod waits for its namespace to be
//     proven;
//  3. the proxy is connected to this start of the daemon and has its
//     whole snapshot;
//  4. no operation runs, and the API is at rest: every pod of the storm
//     is Running and Ready in exactly one ready sandbox, and none is
//     being deleted;
//  5. the agent has caught up: for stormQuiet, nothing the checks read
//     has changed: the daemon's records (with the proxy's ack of each),
//     the files of its state directory, the pods' labels, annotations and
//     readiness, the namespaces' labels, and the requests the proxy got.
//     stormQuiet is longer than the teardown grace, so a record left for
//     teardown when the quiet began was due and would have broken it.
func (s *storm) settle(t *testing.T) (time.Duration, string) {
	l := s.launched
	deadline := time.Now().Add(stormSettleBound)
	var last string
	var changed time.Time
	for {
		why := s.unsettled(t, l)
		sig := s.signature(t)
		now := time.Now()
		if sig != last {
			last, changed = sig, now
		}
		if why == "" && now.Sub(changed) >= stormQuiet {
			return changed.Sub(l.at), ""
		}
		if now.After(deadline) {
			if why == "" {
				why = "its state kept changing"
			}
			return now.Sub(l.at), why
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// unsettled says which of settle's conditions 1 to 4 does not hold, or ""
// when they all do.
func (s *storm) unsettled(t *testing.T, l *stormLaunch) string {
	select {
	case <-l.exited:
		return "nftredird is not running"
	default:
	}
	if !l.serving() {
		return "nftredird is not SERVING"
	}
	if code, body := s.readyz(); code != http.StatusOK {
		return fmt.Sprintf("/readyz answers %d %q", code, body)
	}
	pv := s.proxy.look(false)
	if !pv.live || pv.since.Before(l.at) {
		return "the proxy has no complete snapshot from this start of the daemon"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pods, err := s.pods(ctx)
	if err != nil {
		return err.Error()
	}
	ready, err := s.readySandboxes(ctx)
	if err != nil {
		return err.Error()
	}
	for _, p := range pods {
		switch {
		case p.DeletionTimestamp != nil:
			return fmt.Sprintf("pod %s/%s is being deleted", p.Namespace, p.Name)
		case p.Status.Phase != corev1.PodRunning || !kcluster.PodReady(&p):
			return fmt.Sprintf("pod %s/%s is %s, not Ready", p.Namespace, p.Name, p.Status.Phase)
		case ready[string(p.UID)] != 1:
			return fmt.Sprintf("pod %s/%s has %d ready sandboxes", p.Namespace, p.Name, ready[string(p.UID)])
		}
	}
	return ""
}

// readyz is the daemon's /readyz, or an error's text with code 0.
func (s *storm) readyz() (int, string) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: s.m.DialContext}}
	resp, err := c.Get("http://" + stormMetrics + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b := make([]byte, 512)
	n, _ := resp.Body.Read(b)
	return resp.StatusCode, strings.TrimSpace(string(b[:n]))
}

// signature is everything settle's quiet period watches, as one string.
func (s *storm) signature(t *testing.T) string {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := s.pods(ctx)
	if err != nil {
		return "error " + err.Error()
	}
	for _, p := range pods {
		fmt.Fprintf(&b, "pod %s %s/%s %q %q %s %v %v\n", p.UID, p.Namespace, p.Name, p.Labels[meshLabel], p.Annotations[kube.RedirectionAnnotation], p.Status.Phase, kcluster.PodReady(&p), p.DeletionTimestamp != nil)
	}
	for _, name := range append([]string{stormForeignNS}, stormChaosNamespaces...) {
		ns, err := s.m.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "error " + err.Error()
		}
		fmt.Fprintf(&b, "namespace %s %q\n", name, ns.Labels[meshLabel])
	}
	list, err := s.api.List(ctx)
	if err != nil {
		return "error " + err.Error()
	}
	for _, r := range list.GetPods() {
		fmt.Fprintf(&b, "record %s %s %s\n", r.GetPodUid(), r.GetNetnsId(), r.GetZdsState())
	}
	fmt.Fprintf(&b, "quarantined %d\n", len(list.GetQuarantined()))
	files, err := stateFiles(s.m.daemon.stateDir)
	if err != nil {
		return "error " + err.Error()
	}
	fmt.Fprintf(&b, "files %v\n", files)
	pv := s.proxy.look(false)
	fmt.Fprintf(&b, "proxy %v %d\n", pv.live, pv.received)
	return b.String()
}

// pods lists the storm's pods in the API.
func (s *storm) pods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := s.m.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: stormRoleLabel})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// readySandboxes counts each pod's ready sandboxes, by pod uid.
func (s *storm) readySandboxes(ctx context.Context) (map[string]int, error) {
	resp, err := s.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return nil, fmt.Errorf("CRI ListPodSandbox: %w", err)
	}
	n := map[string]int{}
	for _, sb := range resp.GetItems() {
		n[sb.GetMetadata().GetUid()]++
	}
	return n, nil
}

// stateFiles lists the files under the daemon's state directory,
// relative, sorted.
func stateFiles(dir string) ([]string, error) {
	out, err := exec.Command("find", dir, "-type", "f", "-printf", "%P\\n").Output()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	files := strings.Fields(string(out))
	slices.Sort(files)
	return files, nil
}

// stormView is everything a check looks at, read at one moment of a
// settled node.
type stormView struct {
	pods     []corev1.Pod
	nsLabels map[string]map[string]string
	// sandboxes is every sandbox of the storm's namespaces the runtime
	// knows, ready or not.
	sandboxes []stormSandbox
	// records is GetPod of each pod in the API: nil when NotFound.
	records map[string]*nftredirv1.GetPodResponse
	// listed is ListPods.
	listed []*nftredirv1.Pod
	// files are the state directory's, relative.
	files []string
	proxy proxyView
	// probe is the node probe table's IPv4 set.
	probe []string
	// foreign is the redirection annotation someone else gave a pod,
	// by uid.
	foreign map[string]string
}

// stormSandbox is one sandbox of the runtime and what its network
// namespace holds of ours.
type stormSandbox struct {
	id, podUID, pod string
	ready           bool
	netns           string
	// exists: the namespace's pin is there, with this identity and state.
	exists   bool
	dev, ino uint64
	state    podState
}

// look reads the view.
func (s *storm) look(t *testing.T) *stormView {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	v := &stormView{nsLabels: map[string]map[string]string{}, records: map[string]*nftredirv1.GetPodResponse{}, foreign: s.foreign}
	var err error
	if v.pods, err = s.pods(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{stormForeignNS}, stormChaosNamespaces...) {
		ns, err := s.m.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v.nsLabels[name] = ns.Labels
	}
	resp, err := s.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatalf("CRI ListPodSandbox: %v", err)
	}
	for _, it := range resp.GetItems() {
		md := it.GetMetadata()
		if !s.isStormNamespace(md.GetNamespace()) {
			continue
		}
		sb := stormSandbox{id: it.GetId(), podUID: md.GetUid(), pod: md.GetNamespace() + "/" + md.GetName(), ready: it.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY}
		st, err := s.cri.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: it.GetId(), Verbose: true})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			t.Fatalf("CRI PodSandboxStatus %s: %v", it.GetId(), err)
		}
		sb.netns = sandboxNetns(st.GetInfo()["info"])
		var fi unix.Stat_t
		if sb.netns != "" && unix.Stat(sb.netns, &fi) == nil {
			sb.exists, sb.dev, sb.ino = true, fi.Dev, fi.Ino
			if sb.state, err = observeNetns(sb.netns); err != nil {
				t.Fatal(err)
			}
		}
		v.sandboxes = append(v.sandboxes, sb)
	}
	for _, p := range v.pods {
		r, err := s.api.GetPod(ctx, string(p.UID))
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			t.Fatalf("GetPod %s: %v", p.UID, err)
		default:
			v.records[string(p.UID)] = r
		}
	}
	list, err := s.api.List(ctx)
	if err != nil {
		t.Fatalf("ListPods: %v", err)
	}
	v.listed = list.GetPods()
	if v.files, err = stateFiles(s.m.daemon.stateDir); err != nil {
		t.Fatal(err)
	}
	v.proxy = s.proxy.look(true)
	v.probe = s.m.probeSet(t)
	return v
}

// observeNetns reads what the namespace at path holds of ours, as
// observePod does, in one process.
func observeNetns(path string) (podState, error) {
	const sep = "----"
	script := "nft list tables; echo " + sep + "; ip -4 rule show; echo " + sep + "; ip -6 rule show 2>/dev/null; echo " + sep +
		"; ip -4 route show table 100 2>/dev/null; echo " + sep + "; ip -6 route show table 100 2>/dev/null; true"
	out, err := exec.Command("nsenter", "--net="+path, "--", "sh", "-c", script).Output()
	if err != nil {
		return podState{}, fmt.Errorf("look into %s: %w", path, err)
	}
	parts := strings.Split(string(out), sep+"\n")
	if len(parts) != 5 {
		return podState{}, fmt.Errorf("look into %s: unexpected output %q", path, out)
	}
	var s podState
	for l := range strings.Lines(parts[0]) {
		s.table = s.table || strings.TrimSpace(l) == "table inet "+nftTable
	}
	s.rule4, s.rule6 = isOurRule(parts[1]), isOurRule(parts[2])
	s.route4 = strings.Contains(parts[3], "local default dev lo")
	s.route6 = strings.Contains(parts[4], "local default dev lo")
	return s, nil
}

// stormSelected is the enrolment rule for the labels the storm uses:
// the pod's own label wins, then its namespace's; a pod being deleted is
// not captured.
func stormSelected(p *corev1.Pod, nsLabels map[string]string) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	switch p.Labels[meshLabel] {
	case "none":
		return false
	case meshEnabled:
		return true
	}
	return nsLabels[meshLabel] == meshEnabled
}

// readySandbox is the pod's one ready sandbox, or nil when it has none
// or several.
func (v *stormView) readySandbox(uid string) *stormSandbox {
	var found *stormSandbox
	for i, sb := range v.sandboxes {
		if sb.podUID == uid && sb.ready {
			if found != nil {
				return nil
			}
			found = &v.sandboxes[i]
		}
	}
	return found
}

// capturable: the pod is selected and runs in one ready sandbox, so it
// must be captured there.
func (v *stormView) capturable(p *corev1.Pod) bool {
	return stormSelected(p, v.nsLabels[p.Namespace]) && p.Status.Phase == corev1.PodRunning && v.readySandbox(string(p.UID)) != nil
}

// netnsIdentity is the device and inode of a record's netns_id
// ("dev:ino[:cookie]").
func netnsIdentity(id string) (dev, ino uint64, ok bool) {
	f := strings.Split(id, ":")
	if len(f) < 2 {
		return 0, 0, false
	}
	d, err1 := strconv.ParseUint(f[0], 10, 64)
	i, err2 := strconv.ParseUint(f[1], 10, 64)
	return d, i, err1 == nil && err2 == nil
}

// violations is every way the view departs from a settled node:
//
//   - every selected pod that runs in a sandbox is enrolled there, in sync
//     (our table and policy routing in its namespace), acked by the proxy,
//     in the proxy's current snapshot exactly once with that namespace,
//     annotated "enabled", and marked as annotated by nftredir;
//   - no other pod is enrolled, has our table or routing in any of its
//     sandboxes' namespaces, or is in the proxy's snapshot;
//   - the annotation is on no pod nftredir did not capture, and one
//     someone else wrote is as they wrote it;
//   - nothing is left of a pod that is gone or not captured: no record,
//     record file, sighting, mark, leftover for teardown, quarantined
//     record, temporary file, proxy entry or probe table address; no
//     namespace is held twice by the proxy.
func (v *stormView) violations() []stormViolation {
	var out []stormViolation
	add := func(pod, format string, args ...any) {
		out = append(out, stormViolation{pod: pod, what: fmt.Sprintf(format, args...)})
	}
	byUID := map[string]*corev1.Pod{}
	captured := map[string]bool{}
	for i := range v.pods {
		p := &v.pods[i]
		byUID[string(p.UID)] = p
		if v.capturable(p) {
			captured[string(p.UID)] = true
		}
	}
	name := func(uid string) string {
		if p := byUID[uid]; p != nil {
			return p.Namespace + "/" + p.Name
		}
		return "uid " + uid
	}
	hasFile := func(f string) bool { return slices.Contains(v.files, f) }
	var capturedIPs []string
	for _, p := range v.pods {
		uid := string(p.UID)
		ref := name(uid)
		rec := v.records[uid]
		value, annotated := p.Annotations[kube.RedirectionAnnotation]
		if captured[uid] {
			sb := v.readySandbox(uid)
			switch {
			case rec == nil:
				add(ref, "selected and running, but not enrolled")
			case rec.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC:
				add(ref, "enrolled but %s: %s", rec.GetSyncStatus(), rec.GetDetail())
			default:
				if dev, ino, ok := netnsIdentity(rec.GetPod().GetNetnsId()); !ok || dev != sb.dev || ino != sb.ino {
					add(ref, "enrolled in namespace %s (%s), its sandbox's is %s (%d:%d)", rec.GetPod().GetNetnsPath(), rec.GetPod().GetNetnsId(), sb.netns, sb.dev, sb.ino)
				}
				if rec.GetPod().GetZdsState() != zds.StateAcked {
					add(ref, "enrolled, but the proxy's ack is not recorded (zds_state %q)", rec.GetPod().GetZdsState())
				}
			}
			if !sb.exists || !sb.state.enrolled() {
				add(ref, "selected and running, but its namespace shows %s; want our table and routing", sb.state)
			}
			switch e, ok := v.proxy.held[uid]; {
			case !ok:
				add(ref, "selected and running, but not in the proxy's snapshot")
			case e.dev != sb.dev || e.ino != sb.ino:
				add(ref, "the proxy holds namespace %d:%d for it, its sandbox's is %d:%d", e.dev, e.ino, sb.dev, sb.ino)
			}
			if !annotated || value != redirectionEnabled {
				add(ref, "captured and acked, but %s is %q (present %v); want %q", kube.RedirectionAnnotation, value, annotated, redirectionEnabled)
			}
			if !hasFile(path.Join("seen", "annotated", recordName(p.UID))) {
				add(ref, "captured and annotated, but nftredir keeps no mark of its annotation")
			}
			if ip := p.Status.PodIP; ip != "" && !strings.Contains(ip, ":") {
				capturedIPs = append(capturedIPs, ip)
			}
			continue
		}
		why := "not selected"
		if stormSelected(&p, v.nsLabels[p.Namespace]) {
			why = "selected but not running in one sandbox"
		}
		if rec != nil {
			add(ref, "%s, but enrolled (%s)", why, rec.GetPod().GetNetnsPath())
		}
		if _, ok := v.proxy.held[uid]; ok {
			add(ref, "%s, but in the proxy's snapshot", why)
		}
		if want, ok := v.foreign[uid]; ok {
			if !annotated || value != want {
				add(ref, "someone else's %s=%q became %q (present %v)", kube.RedirectionAnnotation, want, value, annotated)
			}
		} else if annotated {
			add(ref, "%s, but annotated %s=%q", why, kube.RedirectionAnnotation, value)
		}
	}
	for _, sb := range v.sandboxes {
		if !sb.exists || captured[sb.podUID] && sb.ready {
			continue
		}
		if !sb.state.absent() {
			add(sb.pod, "sandbox %s (ready %v) is not a captured pod's, but its namespace %s shows %s", sb.id, sb.ready, sb.netns, sb.state)
		}
	}
	listed := map[string]bool{}
	for _, r := range v.listed {
		listed[r.GetPodUid()] = true
		if byUID[r.GetPodUid()] == nil {
			add(name(r.GetPodUid()), "the daemon keeps a record of a pod gone from the API (%s/%s)", r.GetPodNamespace(), r.GetPodName())
		}
	}
	hashes := map[string]string{}
	for _, p := range v.pods {
		hashes[recordName(p.UID)] = string(p.UID)
	}
	for uid := range listed {
		hashes[recordName(types.UID(uid))] = uid
	}
	for _, f := range v.files {
		dir, base := path.Split(f)
		uid, known := hashes[base]
		switch {
		case strings.HasPrefix(base, durable.TempPrefix):
			add("", "temporary file of an interrupted write left in the state directory: %s", f)
		case dir == "teardown/":
			add("", "a record left for teardown is still there after its grace: %s", f)
		case dir == "quarantine/":
			add("", "a quarantined record: %s", f)
		case dir == "":
			if !known || !listed[uid] {
				add(name(uid), "a record file the daemon does not list: %s", f)
			}
		case dir == "seen/":
			if !known || byUID[uid] == nil {
				add(name(uid), "a sighting of a pod gone from the API: %s", f)
			}
		case dir == "seen/annotated/":
			switch {
			case !known || byUID[uid] == nil:
				add(name(uid), "an annotation mark of a pod gone from the API: %s", f)
			case !captured[uid]:
				add(name(uid), "an annotation mark of a pod nftredir does not capture: %s", f)
			}
		default:
			add("", "an unexpected file in the state directory: %s", f)
		}
	}
	namespaces := map[[2]uint64]string{}
	for _, uid := range slices.Sorted(maps.Keys(v.proxy.held)) {
		e := v.proxy.held[uid]
		if byUID[uid] == nil {
			add(name(uid), "the proxy holds a pod gone from the API")
		}
		k := [2]uint64{e.dev, e.ino}
		if other, ok := namespaces[k]; ok {
			add(name(uid), "the proxy holds its namespace %d:%d for %s too", e.dev, e.ino, name(other))
		}
		namespaces[k] = uid
	}
	for _, twice := range v.proxy.twice {
		add("", "a snapshot named a pod more than once: %s", twice)
	}
	slices.Sort(capturedIPs)
	for _, ip := range v.probe {
		if !slices.Contains(capturedIPs, ip) {
			add("", "the node probe table holds %s, the address of no captured pod", ip)
		}
	}
	for _, ip := range capturedIPs {
		if !slices.Contains(v.probe, ip) {
			add("", "the node probe table lacks %s, a captured pod's address", ip)
		}
	}
	return out
}

// TestCrashStormChecker holds the crash storm's checks to what they
// must find: nothing on a view of a node as it should be, and each kind
// of violation on a view that has it.
func TestCrashStormChecker(t *testing.T) {
	const (
		inUID, outUID, foreignUID = "uid-in", "uid-out", "uid-foreign"
		inIP, outIP               = "10.10.1.5", "10.10.1.6"
	)
	enrolled := podState{table: true, rule4: true, rule6: true, route4: true, route6: true}
	good := func() *stormView {
		pod := func(uid, ns, name, ip string, labels, annotations map[string]string) corev1.Pod {
			p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: ns, Name: name, Labels: labels, Annotations: annotations}}
			p.Status.Phase, p.Status.PodIP = corev1.PodRunning, ip
			return p
		}
		return &stormView{
			pods: []corev1.Pod{
				pod(inUID, "storm-a", "in", inIP, nil, map[string]string{kube.RedirectionAnnotation: redirectionEnabled}),
				pod(outUID, "storm-b", "out", outIP, map[string]string{meshLabel: "none"}, nil),
				pod(foreignUID, stormForeignNS, "foreign-0", "10.10.1.7", nil, map[string]string{kube.RedirectionAnnotation: redirectionEnabled}),
			},
			nsLabels: map[string]map[string]string{"storm-a": {meshLabel: meshEnabled}, "storm-b": {meshLabel: meshEnabled}},
			sandboxes: []stormSandbox{
				{id: "s-in", podUID: inUID, pod: "storm-a/in", ready: true, netns: "/run/netns/cni-in", exists: true, dev: 4, ino: 100, state: enrolled},
				{id: "s-in-old", podUID: inUID, pod: "storm-a/in", netns: "/run/netns/cni-old"},
				{id: "s-out", podUID: outUID, pod: "storm-b/out", ready: true, netns: "/run/netns/cni-out", exists: true, dev: 4, ino: 101},
				{id: "s-foreign", podUID: foreignUID, pod: stormForeignNS + "/foreign-0", ready: true, netns: "/run/netns/cni-f", exists: true, dev: 4, ino: 102},
			},
			records: map[string]*nftredirv1.GetPodResponse{inUID: {
				SyncStatus: nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC,
				Pod:        &nftredirv1.Pod{PodUid: inUID, NetnsPath: "/run/netns/cni-in", NetnsId: "4:100:8193", ZdsState: ptr.To(zds.StateAcked)},
			}},
			listed: []*nftredirv1.Pod{{PodUid: inUID, PodNamespace: "storm-a", PodName: "in"}},
			files: []string{
				recordName(inUID),
				path.Join("seen", recordName(inUID)),
				path.Join("seen", recordName(outUID)),
				path.Join("seen", "annotated", recordName(inUID)),
			},
			proxy:   proxyView{live: true, held: map[string]proxyEntry{inUID: {dev: 4, ino: 100}}},
			probe:   []string{inIP},
			foreign: map[string]string{foreignUID: redirectionEnabled},
		}
	}
	if found := good().violations(); len(found) > 0 {
		t.Fatalf("a node as it should be has violations: %v", found)
	}
	cases := []struct {
		name   string
		breaks func(v *stormView)
		want   string
	}{
		{"selected pod not enrolled", func(v *stormView) { delete(v.records, inUID); v.listed = nil }, "not enrolled"},
		{"drifted", func(v *stormView) { v.records[inUID].SyncStatus = nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED }, "DRIFTED"},
		{"enrolled in another namespace", func(v *stormView) { v.records[inUID].Pod.NetnsId = "4:99:1" }, "its sandbox's is"},
		{"ack not recorded", func(v *stormView) { v.records[inUID].Pod.ZdsState = ptr.To("pending") }, "ack is not recorded"},
		{"table missing", func(v *stormView) { v.sandboxes[0].state.table = false }, "want our table and routing"},
		{"not in the proxy", func(v *stormView) { delete(v.proxy.held, inUID) }, "not in the proxy's snapshot"},
		{"proxy holds an old namespace", func(v *stormView) { v.proxy.held[inUID] = proxyEntry{dev: 4, ino: 7} }, "the proxy holds namespace 4:7"},
		{"pending annotation", func(v *stormView) { v.pods[0].Annotations[kube.RedirectionAnnotation] = redirectionPending }, `is "pending"`},
		{"no mark", func(v *stormView) {
			v.files = slices.DeleteFunc(v.files, func(f string) bool { return strings.HasPrefix(f, "seen/annotated/") })
		}, "no mark"},
		{"unselected pod enrolled", func(v *stormView) {
			v.records[outUID] = &nftredirv1.GetPodResponse{Pod: &nftredirv1.Pod{PodUid: outUID}}
			v.listed = append(v.listed, &nftredirv1.Pod{PodUid: outUID})
			v.files = append(v.files, recordName(outUID))
		}, "not selected, but enrolled"},
		{"released pod keeps our routing", func(v *stormView) { v.sandboxes[2].state.rule4 = true }, "is not a captured pod's"},
		{"old sandbox keeps our table", func(v *stormView) { v.sandboxes[1].exists, v.sandboxes[1].state.table = true, true }, "is not a captured pod's"},
		{"unselected pod in the proxy", func(v *stormView) { v.proxy.held[outUID] = proxyEntry{dev: 4, ino: 101} }, "not selected, but in the proxy's snapshot"},
		{"annotation on an unselected pod", func(v *stormView) {
			v.pods[1].Annotations = map[string]string{kube.RedirectionAnnotation: redirectionEnabled}
		}, "not selected, but annotated"},
		{"someone else's annotation removed", func(v *stormView) { v.pods[2].Annotations = nil }, "someone else's"},
		{"record of a gone pod", func(v *stormView) {
			v.listed = append(v.listed, &nftredirv1.Pod{PodUid: "uid-gone"})
			v.files = append(v.files, recordName("uid-gone"))
		}, "gone from the API"},
		{"record file not listed", func(v *stormView) { v.files = append(v.files, recordName("uid-gone")) }, "does not list"},
		{"leftover", func(v *stormView) { v.files = append(v.files, "teardown/abc.json.1") }, "left for teardown"},
		{"quarantined", func(v *stormView) { v.files = append(v.files, "quarantine/abc.json.1") }, "quarantined"},
		{"temporary file", func(v *stormView) { v.files = append(v.files, durable.TempPrefix+"abc.json-1") }, "temporary file"},
		{"sighting of a gone pod", func(v *stormView) { v.files = append(v.files, path.Join("seen", recordName("uid-gone"))) }, "sighting of a pod gone"},
		{"mark of an unselected pod", func(v *stormView) { v.files = append(v.files, path.Join("seen", "annotated", recordName(outUID))) }, "mark of a pod nftredir does not capture"},
		{"proxy holds a gone pod", func(v *stormView) { v.proxy.held["uid-gone"] = proxyEntry{dev: 4, ino: 200} }, "proxy holds a pod gone"},
		{"proxy holds a namespace twice", func(v *stormView) {
			v.pods[1].Labels = nil
			v.sandboxes[2] = v.sandboxes[0]
			v.sandboxes[2].podUID, v.sandboxes[2].pod, v.sandboxes[2].id = outUID, "storm-b/out", "s-out"
			v.records[outUID] = v.records[inUID]
			v.files = append(v.files, path.Join("seen", "annotated", recordName(outUID)))
			v.pods[1].Annotations = v.pods[0].Annotations
			v.proxy.held[outUID] = v.proxy.held[inUID]
			v.probe = append(v.probe, outIP)
		}, "for storm-a/in too"},
		{"snapshot carried a pod twice", func(v *stormView) { v.proxy.twice = []string{inUID + " (2 times)"} }, "more than once"},
		{"probe address of no captured pod", func(v *stormView) { v.probe = append(v.probe, outIP) }, "the address of no captured pod"},
		{"probe address missing", func(v *stormView) { v.probe = nil }, "lacks " + inIP},
	}
	for _, c := range cases {
		v := good()
		c.breaks(v)
		var got []string
		for _, f := range v.violations() {
			got = append(got, f.String())
		}
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: violations %q; want one saying %q", c.name, got, c.want)
		}
	}
}
