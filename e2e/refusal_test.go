package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/peercred"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/netns/pins"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/probe"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

// The whole-namespace property of a refusal: for every way an AddPod, or
// the Kubernetes agent's enrolment of a running pod, is refused or fails,
// the pod's namespace is afterwards exactly as before it (policy routing
// rules and every routing table of both families, every nftables table,
// legacy xtables of both families, loopback's state, the namespace's net
// sysctls), on the first try and after retries, and the node's namespace
// (the probe table) too; and nothing of the pod stays in the state
// directory. An AddPod that succeeds followed by its RemovePod ends with
// the namespace as before too. Each case runs against the real kernel in
// namespaces of its own.

// world is what a pod's namespace holds before nftredir comes: always its
// eth0 with its IP, a policy rule, route and nftables table of someone
// else's (nftredir must not touch them); then what the case adds.
type world struct {
	name  string
	setup func(t *testing.T, pod *nstest.Netns)
}

// refusalBase is every world's part: the pod's address, and unrelated
// routing and nftables state of another component.
func refusalBase(t *testing.T, pod *nstest.Netns, ip string) {
	t.Helper()
	// Link-local addresses (and their local routes) come with the link
	// at once, not after duplicate address detection while a case runs.
	pod.Sysctl(t, "ipv6.conf.default.accept_dad", "0")
	pod.Sysctl(t, "ipv6.conf.all.accept_dad", "0")
	ipLines(t, pod,
		"link add eth0 type veth peer name peer0",
		"link set eth0 up", "link set peer0 up",
		"addr add "+ip+"/24 dev eth0",
		"rule add pref 1000 fwmark 0x4000/0x4000 lookup 200",
		"route add local 10.200.0.0/16 dev lo table 200",
		"-6 rule add pref 1000 fwmark 0x4000/0x4000 lookup 200",
		"-6 route add local fd00:200::/64 dev lo table 200",
	)
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(pod.IP(t, "-6", "addr", "show", "scope", "link"), "fe80::") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no link-local addresses on eth0 and peer0:\n%s", pod.IP(t, "-6", "addr"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ipLines runs ip commands in pod, a line each; a line may start with a
// family option, which ip's batch mode does not take.
func ipLines(t *testing.T, pod *nstest.Netns, lines ...string) {
	t.Helper()
	for _, l := range lines {
		pod.IP(t, strings.Fields(l)...)
	}
}

var istioRouting = []string{
	"route add local default dev lo table 100",
	"rule add fwmark 0x111/0xfff pref 32764 lookup 100",
	"-6 route add local default dev lo table 100",
	"-6 rule add fwmark 0x111/0xfff pref 32764 lookup 100",
}

func nftFile(t *testing.T, pod *nstest.Netns, ruleset string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", pod.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f in %s: %v: %s\n%s", pod.Name, err, out, ruleset)
	}
}

func restoreInto(t *testing.T, pod *nstest.Netns, cmdName, rules string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", pod.Name, cmdName, "--noflush")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s in %s: %v: %s", cmdName, pod.Name, err, out)
	}
}

// otherAgentTable is an unrelated table another component keeps in every
// pod (a CNI's, say).
const otherAgentTable = `table inet other-agent {
	chain input {
		type filter hook input priority filter + 10; policy accept;
		tcp dport 9999 counter accept
	}
}
`

// istioNftables is istio-cni's nftables backend's table, in part.
const istioNftables = `table inet istio-ambient-nat {
	chain prerouting {
		type nat hook prerouting priority -100; policy accept;
		meta l4proto tcp meta mark & 0xfff != 0x539 redirect to :15006
	}
	chain output {
		type nat hook output priority -100; policy accept;
		meta l4proto tcp meta mark & 0xfff != 0x539 redirect to :15001
	}
}
`

// heldChains keeps istio-cni's ISTIO_OUTPUT in use from a verdict map in
// the same table, which a take-over does not look into: deleting the
// chain in the take-over's batch makes the kernel refuse the whole batch
// (EBUSY), for real.
const heldChains = `table ip nat {
	map held {
		type mark : verdict
		elements = { 0x00007777 : jump ISTIO_OUTPUT }
	}
	chain held-by-map {
		meta mark vmap @held
	}
}
`

// istioIptables is istio-cni's in-pod capture with its iptables backend
// (iptables-nft), both families, and its policy routing.
func istioIptables(t *testing.T, pod *nstest.Netns) {
	ipLines(t, pod, istioRouting...)
	restoreInto(t, pod, "iptables-nft-restore", capturetest.IstioInpodRules(capturetest.IstioV4[0], capturetest.IstioV4[1]))
	restoreInto(t, pod, "ip6tables-nft-restore", capturetest.IstioInpodRules(capturetest.IstioV6[0], capturetest.IstioV6[1]))
}

var worlds = map[string]world{
	"clean": {"clean", func(t *testing.T, pod *nstest.Netns) {}},
	"lo down": {"lo down", func(t *testing.T, pod *nstest.Netns) {
		pod.IP(t, "link", "set", "lo", "down")
	}},
	"istio-cni iptables": {"istio-cni iptables", istioIptables},
	"istio-cni nftables": {"istio-cni nftables", func(t *testing.T, pod *nstest.Netns) {
		ipLines(t, pod, istioRouting...)
		nftFile(t, pod, istioNftables)
	}},
	"legacy iptables": {"legacy iptables", func(t *testing.T, pod *nstest.Netns) {
		ipLines(t, pod, istioRouting...)
		pod.Run(t, "iptables-legacy", strings.Fields(capturetest.LegacyRule)...)
		pod.Run(t, "ip6tables-legacy", strings.Fields(capturetest.LegacyRule)...)
	}},
	"istio-cni iptables, a chain held": {"istio-cni iptables, a chain held", func(t *testing.T, pod *nstest.Netns) {
		istioIptables(t, pod)
		nftFile(t, pod, heldChains)
	}},
}

// snapshot is everything of a namespace a capture agent could change.
func snapshot(t *testing.T, ns *nstest.Netns) string {
	t.Helper()
	var b strings.Builder
	part := func(title, out string) {
		fmt.Fprintf(&b, "== %s\n%s", title, out)
	}
	for _, fam := range []string{"-4", "-6"} {
		part("ip "+fam+" rule", ns.IP(t, fam, "rule", "show"))
		part("ip "+fam+" route table all", ns.IP(t, fam, "route", "show", "table", "all"))
	}
	part("lo", ns.IP(t, "-o", "link", "show", "lo"))
	part("nft ruleset", nftNoise.ReplaceAllString(ns.Nft(t, "list", "ruleset"), "counter"))
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := ns.Exec(save)
		if err != nil {
			t.Fatal(err)
		}
		part(save, legacyNoise.ReplaceAllString(out, ""))
	}
	part("sysctls", netSysctls(t, ns))
	return b.String()
}

// legacyNoise is what iptables-save prints that changes by itself: its
// header and footer comments with the time, and counters; nftNoise the
// counters nft lists.
var (
	legacyNoise = regexp.MustCompile(`(?m)^#.*\n|\[\d+:\d+\]`)
	nftNoise    = regexp.MustCompile(`counter packets \d+ bytes \d+`)
)

// netSysctls reads the namespace's per-interface and forwarding sysctls,
// the ones capture agents set (route_localnet, rp_filter, src_valid_mark,
// forwarding, accept_local, disable_ipv6, ...).
func netSysctls(t *testing.T, ns *nstest.Netns) string {
	t.Helper()
	var lines []string
	err := ns.Do(func() error {
		for _, dir := range []string{"/proc/sys/net/ipv4/conf", "/proc/sys/net/ipv6/conf"} {
			err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				v, err := os.ReadFile(p)
				if err != nil {
					// Write-only entries (ipv6 stable_secret unset).
					return nil
				}
				lines = append(lines, strings.TrimPrefix(p, "/proc/sys/")+"="+strings.TrimSpace(string(v)))
				return nil
			})
			if err != nil {
				return err
			}
		}
		v, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		lines = append(lines, "net/ipv4/ip_forward="+strings.TrimSpace(string(v)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n"
}

// sameSnapshot fails the test when the namespace is not as before.
func sameSnapshot(t *testing.T, what string, before, after string) {
	t.Helper()
	if before == after {
		return
	}
	bl, al := strings.Split(before, "\n"), strings.Split(after, "\n")
	var diff []string
	for _, l := range bl {
		if !slices.Contains(al, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range al {
		if !slices.Contains(bl, l) {
			diff = append(diff, "+ "+l)
		}
	}
	t.Fatalf("%s: the namespace changed:\n%s", what, strings.Join(diff, "\n"))
}

// faults arms one failure at a time, for the steps the property test
// drives: the routing changes (a netns.Guard's Fault) and the kernel
// engine's reading and batches (faultApplier).
type faults struct {
	mu sync.Mutex
	// protects the following fields
	step   string // the step to fail, "" for none
	hits   int
	action func() error // what happens at the step; nil fails it
}

// Errors the injected steps fail with, as the kernel's would.
var errInjected = errors.New("injected: the kernel refused the change")

func (f *faults) arm(step string, action func() error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.step, f.hits, f.action = step, 0, action
}

func (f *faults) at(step string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.step != step {
		return nil
	}
	f.hits++
	if f.action != nil {
		return f.action()
	}
	return errInjected
}

func (f *faults) hit() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

// Steps of the kernel engine besides the routing's.
const (
	stepFind  = "find foreign capture"
	stepBatch = "table batch"
)

// faultApplier is the netlink applier whose reading can fail and whose
// batches the kernel can be made to refuse for real: at stepBatch, the
// ruleset sent carries a jump to a chain that does not exist, which the
// kernel rejects, the whole batch with it.
type faultApplier struct {
	*nft.Netlink
	f *faults
}

func (a faultApplier) FindForeign(ctx context.Context, h *netns.Handle) (*nft.Foreign, error) {
	if err := a.f.at(stepFind); err != nil {
		return nil, err
	}
	return a.Netlink.FindForeign(ctx, h)
}

func (a faultApplier) Apply(ctx context.Context, h *netns.Handle, rs *nft.Ruleset) error {
	if a.f.at(stepBatch) != nil {
		rs = rejectedByKernel(rs)
	}
	return a.Netlink.Apply(ctx, h, rs)
}

func (a faultApplier) TakeOver(ctx context.Context, h *netns.Handle, rs *nft.Ruleset, f *nft.Foreign) error {
	if a.f.at(stepBatch) != nil {
		rs = rejectedByKernel(rs)
	}
	return a.Netlink.TakeOver(ctx, h, rs, f)
}

func rejectedByKernel(rs *nft.Ruleset) *nft.Ruleset {
	bad := *rs
	bad.Chains = slices.Clone(rs.Chains)
	first := bad.Chains[0]
	first.Rules = append(slices.Clone(first.Rules), nft.Rule{
		Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "no-such-chain"}},
		Text:  "jump no-such-chain",
	})
	bad.Chains[0] = first
	return &bad
}

// rig is one node's daemon, in process: the lifecycle over the kernel
// engine, its store, the node probe table in a node namespace, a ZDS
// server, and in Kubernetes mode the agent over a fake API.
type rig struct {
	faults   *faults
	m        *lifecycle.Manager
	store    *state.Store
	stateDir string
	node     *nstest.Netns
	probe    *probe.Manager
	zds      *zds.Server
	zdsSock  string
	agent    *kube.Agent
	api      *fake.Clientset
	pinDir   string
}

type rigOptions struct {
	takeOver   bool
	requireAck bool
	kubernetes bool
	// tmpfsState puts the state directory on a tmpfs of its own, which a
	// case can make read-only.
	tmpfsState bool
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	r := &rig{faults: &faults{}}
	guard, err := netns.NewGuardConfig(netns.GuardConfig{Fault: func(_, step string) error { return r.faults.at(step) }})
	if err != nil {
		t.Fatal(err)
	}
	engine := capture.NewKernel(guard, faultApplier{Netlink: nft.NewNetlink(), f: r.faults}, capture.TakeOverForeign(o.takeOver))
	r.stateDir = filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(r.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if o.tmpfsState {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "nftredir-test-state", r.stateDir).CombinedOutput(); err != nil {
			t.Fatalf("mount a tmpfs on the state dir: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", r.stateDir).Run() })
	}
	if r.store, err = state.Open(r.stateDir, nil); err != nil {
		t.Fatal(err)
	}
	r.node = nstest.NewNetns(t)
	if r.probe, err = probe.New(probe.Config{NetnsPath: r.node.Path, KubeletUID: 4242}); err != nil {
		t.Fatal(err)
	}
	if err := r.probe.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.zdsSock = filepath.Join(t.TempDir(), "ztunnel.sock")
	if r.zds, err = zds.NewServer(zds.Config{
		Pods:        zds.StorePods{Store: r.store},
		Opener:      engine,
		AckTimeout:  time.Second,
		SocketGroup: os.Getegid(),
		Allow:       peercred.Allowlist{UIDs: []uint32{uint32(os.Geteuid())}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.zds.Listen(r.zdsSock); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- r.zds.Serve(ctx) }()
	t.Cleanup(func() {
		r.zds.Close()
		cancel()
		<-served
	})
	cfg := lifecycle.Config{Engine: engine, Store: r.store, ZDS: r.zds, ZDSRequireAck: o.requireAck, Probe: r.probe}
	if o.kubernetes {
		r.pinDir = t.TempDir()
		scanner, err := pins.New(pins.Config{Guard: guard, Dirs: []string{r.pinDir}})
		if err != nil {
			t.Fatal(err)
		}
		r.api = fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Labels: map[string]string{kube.DefaultModeLabel: kube.DefaultModeEnabled}}})
		if r.agent, err = kube.New(kube.Config{Client: r.api, NodeName: "node-1", Dir: state.AgentDir(r.stateDir), Sweep: 150 * time.Millisecond, Pins: scanner}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.agent.Close)
		cfg.Policy = r.agent
	}
	if r.m, err = lifecycle.New(cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

// pod makes a pod's namespace holding world w, pinned where the agent
// looks in Kubernetes mode.
func (r *rig) pod(t *testing.T, w world, ip string) (*nstest.Netns, string) {
	t.Helper()
	pod := nstest.NewNetns(t)
	refusalBase(t, pod, ip)
	nftFile(t, pod, otherAgentTable)
	w.setup(t, pod)
	path := pod.Path
	if r.pinDir != "" {
		path = filepath.Join(r.pinDir, "cni-"+pod.Name)
		if err := os.WriteFile(path, nil, 0o444); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "--bind", pod.Path, path).CombinedOutput(); err != nil {
			t.Fatalf("pin: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", path).Run() })
	}
	return pod, path
}

// nodeState is the node's part: the probe table and its sets.
func (r *rig) nodeState(t *testing.T) string {
	t.Helper()
	return r.node.Nft(t, "list", "ruleset")
}

// records lists the pod records and quarantined ones.
func (r *rig) records(t *testing.T) []string {
	t.Helper()
	var out []string
	recs, err := r.store.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		out = append(out, rec.PodUID)
	}
	qs, err := r.store.QuarantinedAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		out = append(out, "quarantined "+q.Path)
	}
	return out
}

// addReq is the AddPod a CNI ADD of the pod makes.
func addReq(uid, path, ip string) *nftredirv1.AddPodRequest {
	return &nftredirv1.AddPodRequest{PodUid: uid, PodName: "web", PodNamespace: "mesh", NetnsPath: path, PodIps: []string{ip}}
}

// refusal is one way for an AddPod to be refused or fail.
type refusal struct {
	name   string
	worlds []string
	opts   rigOptions
	// arm makes the failure happen in the next try (a step to fail, a
	// read-only state directory, a proxy that never acks); nil when the
	// world alone refuses.
	arm func(t *testing.T, r *rig, pod *nstest.Netns, path string)
	// step, when set, is the step that fails, armed before each try.
	step string
	// agentStopsEarlier: the agent's enrolment fails before its AddPod
	// (it cannot write the sighting either), so it never makes one.
	agentStopsEarlier bool
	// kind is the refusal's kind, as the gRPC code follows it.
	kind lifecycle.Kind
}

// armAll makes the case's failure happen in the next try.
func (c refusal) armAll(t *testing.T, r *rig, pod *nstest.Netns, path string) {
	t.Helper()
	if c.step != "" {
		r.faults.arm(c.step, nil)
	}
	if c.arm != nil {
		c.arm(t, r, pod, path)
	}
}

func refusals() []refusal {
	foreign := []string{"istio-cni iptables", "istio-cni nftables"}
	all := []string{"clean", "istio-cni iptables", "istio-cni nftables"}
	out := []refusal{
		{name: "foreign capture, take-over off", worlds: foreign, kind: lifecycle.KindPrecondition},
		{name: "legacy iptables, take-over off", worlds: []string{"legacy iptables"}, kind: lifecycle.KindPrecondition},
		{name: "legacy iptables, take-over on", worlds: []string{"legacy iptables"}, opts: rigOptions{takeOver: true}, kind: lifecycle.KindPrecondition},
		{name: "take-over batch the kernel rejects", worlds: []string{"istio-cni iptables, a chain held"}, opts: rigOptions{takeOver: true}, kind: lifecycle.KindUnavailable},
		{name: "reading the namespace fails", worlds: all, step: stepFind, kind: lifecycle.KindInternal},
		{name: "lo up fails", worlds: []string{"lo down"}, step: netns.StepLoopbackUp, kind: lifecycle.KindInternal},
	}
	for _, step := range netns.RoutingSteps {
		out = append(out, refusal{name: step + " fails", worlds: all, opts: rigOptions{takeOver: true}, step: step, kind: lifecycle.KindInternal})
		out = append(out, refusal{name: step + " fails, lo down", worlds: []string{"lo down"}, step: step, kind: lifecycle.KindInternal})
	}
	out = append(out,
		refusal{name: "table batch the kernel rejects", worlds: all, opts: rigOptions{takeOver: true}, step: stepBatch, kind: lifecycle.KindInternal},
		refusal{name: "the record write fails", worlds: all, opts: rigOptions{takeOver: true, tmpfsState: true}, kind: lifecycle.KindInternal, agentStopsEarlier: true,
			arm: func(t *testing.T, r *rig, _ *nstest.Netns, _ string) {
				if out, err := exec.Command("mount", "-o", "remount,ro", r.stateDir).CombinedOutput(); err != nil {
					t.Fatalf("make the state dir read-only: %v: %s", err, out)
				}
			}},
		refusal{name: "the proxy never acks", worlds: []string{"clean", "lo down"}, opts: rigOptions{requireAck: true}, kind: lifecycle.KindUnavailable,
			arm: func(t *testing.T, r *rig, _ *nstest.Netns, _ string) { r.silentProxy(t) }},
	)
	return out
}

// silentProxy connects a proxy that says hello and never acks anything,
// once per rig.
func (r *rig) silentProxy(t *testing.T) {
	t.Helper()
	if r.zds.Stats().Connected > 0 {
		return
	}
	p := zdstest.Dial(t, r.zdsSock)
	p.Hello()
	t.Cleanup(p.Close)
	deadline := time.Now().Add(5 * time.Second)
	for r.zds.Stats().Connected == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not connect")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// forEachRefusal runs test for every refusal in every world it applies
// to, each with a pod address of its own in 10.<subnet>.0.0/16.
func forEachRefusal(t *testing.T, subnet int, test func(t *testing.T, c refusal, world, ip string)) {
	nstest.RequirePrivileged(t)
	n := 0
	for _, c := range refusals() {
		for _, wn := range c.worlds {
			n++
			ip := fmt.Sprintf("10.%d.%d.%d", subnet, n/200, 2+n%200)
			t.Run(c.name+"/"+wn, func(t *testing.T) { test(t, c, wn, ip) })
		}
	}
}

// TestRefusedAddPodChangesNothing: through the API (AddPod, as a CNI ADD
// or an operator calls it), every refusal and failure, on the first try
// and two retries.
func TestRefusedAddPodChangesNothing(t *testing.T) {
	forEachRefusal(t, 81, func(t *testing.T, c refusal, wn, ip string) {
		r := newRig(t, c.opts)
		pod, path := r.pod(t, worlds[wn], ip)
		before, node := snapshot(t, pod), r.nodeState(t)
		for try := 1; try <= 3; try++ {
			c.armAll(t, r, pod, path)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err := r.m.AddPod(ctx, addReq("uid-refused", path, ip))
			cancel()
			if err == nil {
				t.Fatalf("try %d: AddPod succeeded", try)
			}
			if k := lifecycle.Classify(err).Kind; k != c.kind {
				t.Errorf("try %d: %v: kind %v; want %v", try, err, k, c.kind)
			}
			if try == 1 {
				t.Logf("refused: %v", err)
			}
			sameSnapshot(t, fmt.Sprintf("try %d (%v)", try, err), before, snapshot(t, pod))
			sameSnapshot(t, fmt.Sprintf("try %d, the node's namespace", try), node, r.nodeState(t))
			if recs := r.records(t); len(recs) != 0 {
				t.Fatalf("try %d: records %v", try, recs)
			}
		}
		if h := r.faults.hit(); c.step != "" && h == 0 {
			t.Errorf("step %s was never reached", c.step)
		}
	})
}

// TestRefusedEnrolmentChangesNothing: in Kubernetes mode, the agent
// finds a running pod its policy selects among the runtime's pins and
// enrols it; every refusal and failure leaves the namespace as before,
// however often the agent retries (its sweep runs every 150 ms here).
func TestRefusedEnrolmentChangesNothing(t *testing.T) {
	forEachRefusal(t, 82, func(t *testing.T, c refusal, wn, ip string) {
		o := c.opts
		o.kubernetes = true
		r := newRig(t, o)
		pod, path := r.pod(t, worlds[wn], ip)
		before, node := snapshot(t, pod), r.nodeState(t)
		c.armAll(t, r, pod, path)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		web := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "mesh", UID: types.UID("uid-agent")},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		}
		if _, err := r.api.CoreV1().Pods("mesh").Create(ctx, web, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		enr := &quiet{Manager: r.m}
		if err := r.agent.Start(ctx, enr); err != nil {
			t.Fatal(err)
		}
		// Start's pass, then the agent's retries (an armed step
		// fails every time it is reached): the namespace, the
		// node's and the records are looked at between two of its
		// AddPods, never during one.
		look := func(what string) {
			t.Helper()
			var snap, nodeSnap string
			var recs []string
			enr.between(func() string {
				snap, nodeSnap, recs = snapshot(t, pod), r.nodeState(t), r.records(t)
				return ""
			})
			sameSnapshot(t, what, before, snap)
			sameSnapshot(t, what+", the node's namespace", node, nodeSnap)
			if len(recs) != 0 {
				t.Fatalf("%s: records %v", what, recs)
			}
		}
		if c.agentStopsEarlier {
			time.Sleep(time.Second)
			if n := enr.tries(); n != 0 {
				t.Fatalf("the agent enrolled %d times", n)
			}
			look("after a second")
		}
		deadline := time.Now().Add(20 * time.Second)
		for seen := 0; seen < 4 && !c.agentStopsEarlier; {
			if time.Now().After(deadline) {
				t.Fatalf("the agent tried %d times in 20s", enr.tries())
			}
			time.Sleep(50 * time.Millisecond)
			if n := enr.tries(); n > seen {
				seen = n
				look(fmt.Sprintf("after try %d", n))
			}
		}
		p, err := r.api.CoreV1().Pods("mesh").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := p.Annotations[kube.RedirectionAnnotation]; ok {
			t.Errorf("the pod is annotated %q", v)
		}
	})
}

// quiet is the lifecycle engine as the agent sees it, counting the
// AddPods it makes and letting the test look at the namespace between two
// of them.
type quiet struct {
	*lifecycle.Manager
	mu sync.RWMutex
	// n is guarded by mu's write side: AddPods hold the read side.
	n atomicCounter
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCounter) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *atomicCounter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (q *quiet) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	defer q.n.add()
	return q.Manager.AddPod(ctx, req)
}

func (q *quiet) tries() int { return q.n.get() }

// between runs look while no AddPod is in flight, and says how many had
// ended before it.
func (q *quiet) between(look func() string) (int, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n.get(), look()
}

// TestAddThenRemoveChangesNothing: an AddPod that succeeds, then its
// RemovePod, leave the namespace as before, whatever the options, beside
// another component's routing and table, with and without IPv6.
func TestAddThenRemoveChangesNothing(t *testing.T) {
	nstest.RequirePrivileged(t)
	dns := true
	cases := []struct {
		name string
		v6   bool
		opts *nftredirv1.RedirectOptions
	}{
		{"defaults", true, nil},
		{"redirect mode, DNS, exclusions", true, &nftredirv1.RedirectOptions{
			CaptureMode: nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT, DnsCapture: &dns,
			ExcludeInboundPorts: []uint32{8080}, ExcludeOutboundPorts: []uint32{5432}, ExcludeOutboundCidrs: []string{"10.96.0.0/12"},
		}},
		{"no IPv6", false, nil},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, rigOptions{})
			ip := fmt.Sprintf("10.83.0.%d", 2+i)
			pod, path := r.pod(t, worlds["clean"], ip)
			if !c.v6 {
				pod.Sysctl(t, "ipv6.conf.all.disable_ipv6", "1")
				pod.Sysctl(t, "ipv6.conf.lo.disable_ipv6", "1")
			}
			before, node := snapshot(t, pod), r.nodeState(t)
			req := addReq("uid-ok", path, ip)
			req.Options = c.opts
			for round := 1; round <= 2; round++ {
				if _, err := r.m.AddPod(context.Background(), req); err != nil {
					t.Fatalf("round %d: AddPod: %v", round, err)
				}
				if snapshot(t, pod) == before {
					t.Fatalf("round %d: AddPod changed nothing in the namespace", round)
				}
				if _, err := r.m.RemovePod(context.Background(), &nftredirv1.RemovePodRequest{PodUid: "uid-ok"}); err != nil {
					t.Fatalf("round %d: RemovePod: %v", round, err)
				}
				sameSnapshot(t, fmt.Sprintf("round %d, after RemovePod", round), before, snapshot(t, pod))
				sameSnapshot(t, fmt.Sprintf("round %d, the node's namespace", round), node, r.nodeState(t))
				if recs := r.records(t); len(recs) != 0 {
					t.Fatalf("round %d: records %v", round, recs)
				}
			}
		})
	}
}

// TestVanishingNamespaceLeavesNoTrace: the namespace's path disappears
// at each step of an AddPod (its sandbox deleted meanwhile). The call
// works on the namespace it opened, as it must; the RemovePod that
// follows (the runtime's DEL) leaves no record, no probe entry and no
// proxy entry, and the namespace, still held open by the test, is as
// before.
func TestVanishingNamespaceLeavesNoTrace(t *testing.T) {
	nstest.RequirePrivileged(t)
	steps := append([]string{stepFind}, netns.RoutingSteps...)
	steps = append(steps, stepBatch)
	for i, step := range steps {
		t.Run(step, func(t *testing.T) {
			r := newRig(t, rigOptions{})
			ip := fmt.Sprintf("10.84.0.%d", 2+i)
			pod, _ := r.pod(t, worlds["clean"], ip)
			// The path the daemon gets is a pin of the namespace's own,
			// which the step unmounts; pod.Path keeps it for the test.
			pin := filepath.Join(t.TempDir(), "cni-vanishing")
			if err := os.WriteFile(pin, nil, 0o444); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mount", "--bind", pod.Path, pin).CombinedOutput(); err != nil {
				t.Fatalf("pin: %v: %s", err, out)
			}
			t.Cleanup(func() { exec.Command("umount", "-l", pin).Run() })
			before, node := snapshot(t, pod), r.nodeState(t)
			r.faults.arm(step, func() error {
				if out, err := exec.Command("umount", pin).CombinedOutput(); err != nil {
					return fmt.Errorf("umount %s: %v: %s", pin, err, out)
				}
				return os.Remove(pin)
			})
			_, addErr := r.m.AddPod(context.Background(), addReq("uid-vanish", pin, ip))
			t.Logf("AddPod while the path vanished at %s: %v", step, addErr)
			if _, err := r.m.RemovePod(context.Background(), &nftredirv1.RemovePodRequest{PodUid: "uid-vanish"}); err != nil {
				t.Fatalf("RemovePod: %v", err)
			}
			if addErr != nil {
				sameSnapshot(t, "after the failed AddPod and RemovePod", before, snapshot(t, pod))
			}
			sameSnapshot(t, "the node's namespace", node, r.nodeState(t))
			if recs := r.records(t); len(recs) != 0 {
				t.Fatalf("records %v", recs)
			}
			if st := r.zds.State("uid-vanish"); st == zds.StateAcked {
				t.Errorf("the proxy still holds the pod")
			}
			els, err := r.probe.Elements(context.Background())
			if _, held := els[netip.MustParseAddr(ip)]; err != nil || held {
				t.Errorf("probe set %v (%v) still holds %s", els, err, ip)
			}
		})
	}
}
