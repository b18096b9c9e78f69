package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/nftredir/nftredir/internal/calltrace"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/istiotest"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/signtest"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/nri"
)

// Pod start as the kubelet sees it: the project's real single-node
// cluster (internal/kcluster: kubelet, containerd with NRI, bridge +
// host-local), with nftredird in Kubernetes mode and a node proxy
// connected over ZDS. Four variants take turns in one cluster: no
// nftredir in the pod's path at all; the daemon enrolling through the
// runtime's NRI, a pod outside the mesh and one inside it; and the daemon
// enrolling through nftredir-cni chained after the pod network, a pod
// inside the mesh. They are reported as differences and ratios to the
// first, of the same run, so that the machine's drift weighs on all.

// The pod start section's variants.
const (
	psBare   = "no nftredir"
	psNRIOut = "NRI, pod not captured"
	psNRI    = "NRI, pod captured"
	psCNI    = "CNI (nftredir-cni), pod captured"
)

var psVariants = []string{psBare, psNRIOut, psNRI, psCNI}

// psHalf is the half of a round run with the daemon in one enrolment
// mode. A daemon registered with the runtime's NRI hears of every
// sandbox of the node, so the variants without it run while it enrols
// through the CNI chain, and the daemon is restarted between the halves.
type psHalf struct {
	enrolment string
	blocks    []psBlock
}

// psBlock is a run of pods on one chain: first an untimed pod, then the
// block's variants taking turns pod by pod. The chain is written before
// the untimed pod when it changes, so that no timed pod is the first
// after containerd reloaded its network config, nor after the daemon's
// restart.
type psBlock struct {
	// plugin: nftredir-cni is chained after the pod network.
	plugin   bool
	variants []string
	// warmUp is the namespace of the untimed pod: outside the mesh, so
	// that under CNI the AddPod it makes is told from a timed pod's (it
	// programs nothing: no kernel phase).
	warmUp string
}

var psHalves = [2]psHalf{
	{enrolment: defaults.EnrolmentNRI, blocks: []psBlock{{variants: []string{psNRIOut, psNRI}, warmUp: "ps-out"}}},
	{enrolment: defaults.EnrolmentCNI, blocks: []psBlock{
		{variants: []string{psBare}, warmUp: "ps-bare"},
		{plugin: true, variants: []string{psCNI}, warmUp: "ps-bare"},
	}},
}

// halvesOf is round's halves in the order they run: the order alternates
// from round to round, so that each round ends in the mode the next one
// starts with (one restart a round), and neither mode always goes first.
func halvesOf(round int) [2]psHalf {
	if round%2 == 1 {
		return [2]psHalf{psHalves[1], psHalves[0]}
	}
	return psHalves
}

// blocksOf is a half's blocks in the order they run in round: reversed
// in every other round, so that neither always follows the other. The
// first round ends with nftredir-cni's block, so that even a run of one
// round tears its cluster down with nftredir-cni in the chain.
func blocksOf(h psHalf, round int) []psBlock {
	out := slices.Clone(h.blocks)
	if round%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// turnOrder is the order of a block's variants for the i-th turn of
// round: each goes first, and follows the other, equally often.
func turnOrder(b psBlock, round, i int) []string {
	out := slices.Clone(b.variants)
	if (round+i)%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// The section's targets: what capture may add to a pod's sandbox, what
// the NRI handler may take for a pod it leaves alone, and what
// Kubernetes mode may add to AddPod in the daemon.
const (
	maxCNIExtraMS     = 5.0
	maxNRIExtraMS     = 1.0 // over the captured pod's kernel phases
	maxNRIOutHandlerM = 0.2
	minSignRounds     = 10
	maxKubeAddRatio   = 1.25
)

var (
	goalNRIOut        = fmt.Sprintf("NRI, pod not captured: no RunPodSandbox difference from no nftredir that the sign test resolves, over ≥ %d rounds", minSignRounds)
	goalNRIOutHandler = fmt.Sprintf("NRI, pod not captured: the daemon's RunPodSandbox handler ≤ %g ms (p50)", maxNRIOutHandlerM)
	goalNRICaptured   = fmt.Sprintf("NRI, pod captured: RunPodSandbox ≤ no nftredir's + its kernel phases + %g ms (p50s)", maxNRIExtraMS)
	goalCNICaptured   = fmt.Sprintf("CNI, pod captured: RunPodSandbox ≤ no nftredir's + %g ms (p50s)", maxCNIExtraMS)
	goalKubeAdd       = fmt.Sprintf("AddPod in the daemon in Kubernetes mode (CNI, captured) ≤ %g× standalone with the same ruleset (p50s)", maxKubeAddRatio)
)

// podStart is one pod's start.
type podStart struct {
	variant string
	round   int
	name    string
	uid     string
	// sandbox is containerd's RunPodSandbox and cni the CNI chain's ADD
	// within it, both from its log; ready is from the Create call until a
	// watch saw the pod Ready.
	sandbox, cni, ready time.Duration
	// proxyCPU and daemonCPU are the CPU time the node proxy (stock
	// ztunnel only) and the Kubernetes-mode daemon used from the pod's
	// Create call until it was Ready.
	proxyCPU, daemonCPU time.Duration
	// sbProxyCPU and sbDaemonCPU are the same during its RunPodSandbox.
	sbProxyCPU, sbDaemonCPU time.Duration
}

// callLine is one call as the daemon logged it: an AddPod over gRPC or
// an NRI RunPodSandbox.
type callLine struct {
	total  time.Duration
	phases map[string]float64 // ms, by calltrace phase
	// pod and captured are the NRI handler's (its line names the pod).
	pod      string
	captured bool
}

// pluginLine is one ADD as nftredir-cni logged it.
type pluginLine struct {
	captured bool
	call     float64 // ms: its AddPod call
	run      float64 // ms: from its Go start to the answer
}

// podStartResult is what the section measured.
type podStartResult struct {
	proxy    string
	rounds   int
	perRound int
	pods     []podStart
	// kube holds the Kubernetes-mode daemon's handlers, by variant: the
	// NRI RunPodSandbox of psNRIOut's and psNRI's pods, the gRPC AddPod
	// of psCNI's. alone holds the standalone daemon's, sequential, in
	// each round while the cluster ran.
	kube    map[string][]callLine
	alone   []callLine
	aloneE2 []time.Duration // standalone AddPod end to end
	// same and sameE2 are a second standalone daemon's, programming what
	// the Kubernetes-mode daemon programs (sameSpecFlags): the base of
	// the Kubernetes-mode AddPod's ratio, so that it measures Kubernetes
	// mode and not a different ruleset.
	same   []callLine
	sameE2 []time.Duration
	plugin []pluginLine
	// versionExec is a bare exec of nftredir-cni (VERSION) in this
	// section, for the plugin's start-up cost; goExec, timed turn about
	// with it, that of the smallest Go program next to this one (pause
	// -v), the floor under any Go plugin's exec. goExec is empty when
	// there is no such program.
	versionExec []time.Duration
	goExec      []time.Duration
	// anyExec, timed turn about with both, is the system's true(1) (a C
	// program that does nothing): the floor under any plugin's exec,
	// whatever its language. Empty when there is no true in PATH.
	anyExec []time.Duration
	// baselineExec is the same of -baseline-cni's plugin, timed turn
	// about with both; empty without it.
	baselineExec []time.Duration
	baselineCNI  string
	clusterUp    time.Duration
	// restarts are the daemon's restarts between the halves, from the
	// stop until it served again with its node proxy connected.
	restarts []time.Duration
	load     []float64
}

// psMetric is one of the times taken of each pod start.
type psMetric int

const (
	// mSandbox is containerd's RunPodSandbox: what the kubelet waits for.
	mSandbox psMetric = iota
	// mCNI is the CNI chain's ADD within it, as containerd timed it.
	mCNI
	// mRest is RunPodSandbox outside the chain (the sandbox's namespace,
	// the pause container through runc and its shim, the NRI hook): the
	// same work for every variant but the NRI hook's, and most of the
	// run's noise.
	mRest
	// mReady is from the Create call to the watch event of the pod Ready.
	mReady
)

func (p podStart) time(m psMetric) time.Duration {
	switch m {
	case mCNI:
		return p.cni
	case mRest:
		return p.sandbox - p.cni
	case mReady:
		return p.ready
	}
	return p.sandbox
}

// durations returns a variant's times of one kind (all rounds, or one).
func (r *podStartResult) durations(variant string, round int, m psMetric) []time.Duration {
	var out []time.Duration
	for _, p := range r.pods {
		if p.variant != variant || (round >= 0 && p.round != round) || p.sandbox == 0 || p.cni == 0 {
			continue
		}
		out = append(out, p.time(m))
	}
	return out
}

func p50ms(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	return msf(newDist(ds).q(0.5))
}

// perRoundVs is, per round, a variant's p50 minus (or divided by) the
// bare variant's p50 of the same round.
func (r *podStartResult) perRoundVs(variant string, m psMetric, ratio bool) []float64 {
	var out []float64
	for round := range r.rounds {
		v, b := p50ms(r.durations(variant, round, m)), p50ms(r.durations(psBare, round, m))
		if v == 0 || b == 0 {
			continue
		}
		if ratio {
			out = append(out, v/b)
		} else {
			out = append(out, v-b)
		}
	}
	return out
}

// pooledVs is a variant's p50 over every round minus (or divided by)
// the bare variant's.
func (r *podStartResult) pooledVs(variant string, m psMetric, ratio bool) float64 {
	v, b := p50ms(r.durations(variant, -1, m)), p50ms(r.durations(psBare, -1, m))
	if ratio {
		return v / b
	}
	return v - b
}

// signs is how a variant's per-round differences from the bare variant
// fall: above, below, and the sign test's chance of so lopsided a split
// were the two equal.
type signs struct {
	above, below int
	chance       float64
}

func (s signs) rounds() int { return s.above + s.below }

// resolved says whether the run tells the difference from noise.
func (s signs) resolved() bool { return s.chance < signtest.Significance }

func (r *podStartResult) signsVs(variant string, m psMetric) signs {
	var s signs
	s.above, s.below = signtest.Count(r.perRoundVs(variant, m, false))
	s.chance = signtest.Chance(s.above, s.below)
	return s
}

// podStartPhase runs the section: a cluster, the daemon in Kubernetes
// mode, a node proxy, rounds of pods; d is the standalone daemon, timed
// in each round for the Kubernetes-mode AddPod's ratio.
func (b *bench) podStartPhase(ctx context.Context, d *daemon, res *results) error {
	binDir, err := findCNIPlugins(b.cfg.cniBin)
	if err != nil {
		return err
	}
	sameDir := filepath.Join(b.work, "same-spec")
	if err := os.Mkdir(sameDir, 0o700); err != nil {
		return err
	}
	same, err := b.startDaemon(sameDir, sameSpecFlags...)
	if err != nil {
		return fmt.Errorf("pod start: the standalone daemon with Kubernetes mode's spec: %w", err)
	}
	if _, err := same.waitServing(ctx, time.Minute); err != nil {
		b.stopDaemon(same)
		return fmt.Errorf("pod start: the standalone daemon with Kubernetes mode's spec: %w", err)
	}
	t := newProgTB(ctx, func(format string, args ...any) { b.progress("  kcluster: "+format, args...) })
	r := &podStartResult{rounds: b.cfg.psRounds, perRound: b.cfg.psPods, kube: map[string][]callLine{}}
	err = t.run(func(t *progTB) { b.podStart(t, d, same, binDir, r) })
	b.progress("pod start: tearing the cluster down")
	if cerr := t.finish(); err == nil && cerr != nil {
		err = fmt.Errorf("cluster teardown: %w", cerr)
	}
	if serr := b.stopDaemon(same); err == nil && serr != nil {
		err = fmt.Errorf("stop the standalone daemon with Kubernetes mode's spec: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("pod start: %w", err)
	}
	res.podStart = r
	return nil
}

// sameSpecFlags make a standalone daemon program what the Kubernetes-mode
// daemon of this section programs for a pod without annotations: DNS
// capture on (Kubernetes mode's default, as Istio's), no node probe set
// (no --probe-snat or --kubelet-uid there), no metrics served.
var sameSpecFlags = []string{
	"--dns-capture=" + strconv.FormatBool(defaults.KubernetesCaptureDNS),
	"--probe-snat=false",
	"--metrics-address=",
	"--log-format", "json",
}

// psSettle is the pause after the daemon's restart, before the half's
// first untimed pod: its start-up work (informers, the agent's first
// pass, the node proxy's snapshot) is done by then.
const psSettle = 2 * time.Second

func (b *bench) podStart(t *progTB, alone, same *daemon, binDir string, r *podStartResult) {
	// The daemon's state, its Kubernetes state and sockets on the run's
	// tmpfs, as /run is on a node; the plugin's data dir and logs on disk,
	// as /var/lib and /var/log are. The dir is made before the cluster so
	// that it is removed after the cluster's teardown, whose CNI DELs
	// still run the plugin, which logs there.
	dir, run := t.TempDir(), filepath.Join(b.work, "kube")
	begin := time.Now()
	b.progress("pod start: starting the cluster (internal/kcluster)")
	// containerd's NRI is on, as by default in containerd 2.x, with no
	// validator: nothing of nftredir is configured in the runtime, so the
	// bare variant has nftredir nowhere in its path.
	c := kcluster.Start(t, kcluster.Options{ContainerdDebug: true})
	r.clusterUp = time.Since(begin)
	c.InstallCNIPlugin(t, "nftredir-cni", filepath.Join(binDir, "nftredir-cni"))
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	zdsSock := filepath.Join(run, "zds.sock")
	cniLog := filepath.Join(dir, "cni.log")

	// nftredird in Kubernetes mode, as a host process in the node's
	// namespace, its flags as the e2e suite's mesh cluster gives them;
	// restarted between the halves of each round in the other mode.
	kd := &kubeDaemon{c: c, bin: b.cfg.daemon, run: run, logDir: dir, zdsSock: zdsSock}
	t.Cleanup(func() {
		if err := kd.stop(); err != nil {
			t.Errorf("stop the Kubernetes-mode daemon: %v", err)
		}
	})
	if err := kd.start(t.Context(), halvesOf(0)[0].enrolment, false); err != nil {
		t.Fatal(err)
	}

	// A node proxy on the ZDS socket: stock ztunnel (with istiod) when
	// its binary is given, else a stand-in that acks every pod.
	proxyPID := 0
	if os.Getenv(istiotest.ZtunnelEnv) != "" {
		bins := istiotest.Require(t)
		b.progress("pod start: starting istiod and ztunnel (%s)", bins.Ztunnel)
		istiod := istiotest.StartIstiod(t, c, bins)
		proxyPID = istiotest.StartZtunnel(t, c, bins, istiod, zdsSock).Pid()
		r.proxy = "ztunnel (" + istiotest.ZtunnelEnv + "=" + bins.Ztunnel + ") with istiod " + istiotest.Version
	} else {
		standInProxy(t, zdsSock)
		r.proxy = "a stand-in that acks every pod over ZDS (set " + istiotest.ZtunnelEnv + " for stock ztunnel)"
	}
	if err := kd.waitProxy(t.Context(), kd.mark); err != nil {
		t.Fatal(err)
	}

	withPlugin := map[string]any{
		"type":              "nftredir-cni",
		"socket":            kd.socket(),
		"timeout":           "10s",
		"excludeNamespaces": []string{"kube-system", "istio-system"},
		"logFile":           cniLog,
		"dataDir":           filepath.Join(dir, "cni-data"),
	}
	nss := map[string]string{psBare: "ps-bare", psNRIOut: "ps-out", psNRI: "ps-mesh", psCNI: "ps-mesh"}
	c.CreateNamespace(t, "ps-bare", nil)
	c.CreateNamespace(t, "ps-out", nil)
	c.CreateNamespace(t, "ps-mesh", map[string]string{kube.DefaultModeLabel: kube.DefaultModeEnabled})
	image := c.Standin(t)

	withCNI := false
	useChain := func(plugin bool) {
		if withCNI == plugin {
			return
		}
		if plugin {
			c.WriteConflist(t, withPlugin)
		} else {
			c.WriteConflist(t)
		}
		withCNI = plugin
	}
	kubeMark := kd.mark
	// The daemon's and the proxy's CPU, sampled through the rounds, so
	// that what they used during each sandbox can be read afterwards.
	cpu := sampleCPU(&kd.pid, proxyPID, cpuSampleEvery)
	cri := c.CRI(t)
	// runPod starts one pod alone on the node: created, Ready, deleted
	// and torn down before the next, so that no variant starts beside
	// more pods than another. Its CPU figures are the daemon's and the
	// proxy's from its Create call until it was Ready.
	runPod := func(ns, name string) podStart {
		proxy0, daemon0 := taskCPU(proxyPID), taskCPU(int(kd.pid.Load()))
		ps, err := startPod(t.Context(), c, ns, name, image)
		if err != nil {
			t.Fatalf("%s/%s: %v", ns, name, err)
		}
		ps.daemonCPU = taskCPU(int(kd.pid.Load())) - daemon0
		if proxyPID != 0 {
			ps.proxyCPU = taskCPU(proxyPID) - proxy0
		}
		if err := deletePods(t.Context(), c, ns, []string{name}); err != nil {
			t.Fatal(err)
		}
		if err := waitSandboxStopped(t.Context(), cri, ps.uid); err != nil {
			t.Fatal(err)
		}
		// Let what the teardown set off (the kubelet's, the daemon's and
		// the proxy's reactions) settle.
		b.sleep(t.Context(), podGap)
		return ps
	}
	for round := range r.rounds {
		r.load = append(r.load, loadAvg())
		b.progress("pod start, round %d/%d: %d pods per variant, one at a time (load %.2f)", round+1, r.rounds, r.perRound, loadAvg())
		first := len(r.pods)
		for hi, h := range halvesOf(round) {
			if kd.mode != h.enrolment {
				took, err := kd.restart(t.Context(), h.enrolment)
				if err != nil {
					t.Fatal(err)
				}
				r.restarts = append(r.restarts, took)
				b.sleep(t.Context(), psSettle)
			}
			for bi, blk := range blocksOf(h, round) {
				useChain(blk.plugin)
				runPod(blk.warmUp, fmt.Sprintf("psw%d-%d-%d", round, hi, bi))
				for i := range r.perRound {
					for j, v := range turnOrder(blk, round, i) {
						ps := runPod(nss[v], fmt.Sprintf("ps%d-%d-%d-%d-%d", round, hi, bi, i, j))
						ps.variant, ps.round = v, round
						r.pods = append(r.pods, ps)
					}
				}
			}
		}
		for _, v := range psVariants {
			var ready []time.Duration
			for _, p := range r.pods[first:] {
				if p.variant == v {
					ready = append(ready, p.ready)
				}
			}
			b.progress("  %-36s create→Ready p50 %6.1f ms", v, p50ms(ready))
		}
		// The standalone daemon, sequential, while the cluster runs: the
		// base of the Kubernetes-mode AddPod's ratio. The two standalone
		// daemons take turns going first.
		order := []*daemon{alone, same}
		if round%2 == 1 {
			order = []*daemon{same, alone}
		}
		for _, d := range order {
			lines, e2e, err := b.aloneAddPods(t.Context(), d, round)
			if err != nil {
				t.Fatalf("standalone AddPod: %v", err)
			}
			if d == alone {
				r.alone = append(r.alone, lines...)
				r.aloneE2 = append(r.aloneE2, e2e...)
			} else {
				r.same = append(r.same, lines...)
				r.sameE2 = append(r.sameE2, e2e...)
			}
		}
	}
	cpu.stop()
	plugin := execTiming{bin: filepath.Join(binDir, "nftredir-cni"), env: []string{"CNI_COMMAND=VERSION"}, stdin: `{"cniVersion":"1.0.0"}`}
	floor := execTiming{bin: minimalGoProgram(), args: []string{"-v"}}
	anyFloor := execTiming{bin: smallestProgram()}
	baseline := plugin
	baseline.bin = b.cfg.baselineCNI
	times, err := timeExecs(execSamples, plugin, floor, anyFloor, baseline)
	if err != nil {
		t.Fatal(err)
	}
	r.versionExec, r.goExec, r.anyExec, r.baselineExec, r.baselineCNI = times[0], times[1], times[2], times[3], b.cfg.baselineCNI

	// containerd's own measure of each sandbox.
	sb, err := sandboxTimes(c.ComponentLog("containerd"))
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for i := range r.pods {
		if w, ok := sb[r.pods[i].uid]; ok && w.cni > 0 {
			r.pods[i].sandbox, r.pods[i].cni = w.d(), w.cni
			r.pods[i].sbDaemonCPU, r.pods[i].sbProxyCPU = cpu.within(w.start, w.end)
		} else {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("containerd's log has no RunPodSandbox pair, or no CNI setup lines within it, for %d of %d pods", missing, len(r.pods))
	}
	if err := r.takeHandlerLines(kd.log, kubeMark, kd.logSize()); err != nil {
		t.Fatal(err)
	}
	if r.plugin, err = pluginLines(cniLog); err != nil {
		t.Fatal(err)
	}
}

// takeHandlerLines sorts the Kubernetes-mode daemon's log lines between
// two marks by variant: the gRPC AddPods that captured a pod (a kernel
// phase) are psCNI's pods' (the plugin is chained for them and for the
// untimed pods outside the mesh before them, which it does not capture),
// the NRI RunPodSandbox lines are matched to their pods by UID (the
// untimed pods' dropped). Every timed pod must have its line, and each
// line the outcome its variant means.
func (r *podStartResult) takeHandlerLines(logPath string, from, to int64) error {
	lines, err := readCallLines(logPath, from, to)
	if err != nil {
		return err
	}
	variant := map[string]string{}
	want := map[string]int{}
	for _, p := range r.pods {
		variant[p.uid] = p.variant
		want[p.variant]++
	}
	for _, l := range lines {
		if l.pod == "" {
			if _, captured := l.phases["kernel"]; captured {
				r.kube[psCNI] = append(r.kube[psCNI], l)
			}
			continue
		}
		v := variant[l.pod]
		if v == "" {
			continue // a warm-up pod's
		}
		if l.captured != (v == psNRI) {
			return fmt.Errorf("the daemon's RunPodSandbox of a pod of %q says captured=%v", v, l.captured)
		}
		r.kube[v] = append(r.kube[v], l)
	}
	for _, v := range []string{psNRIOut, psNRI, psCNI} {
		if n := len(r.kube[v]); n != want[v] {
			return fmt.Errorf("the Kubernetes-mode daemon logged %d calls for %s, want %d", n, v, want[v])
		}
	}
	return nil
}

// kubeDaemon is the section's nftredird in Kubernetes mode, in one
// enrolment mode at a time: stopped and started again in the other
// between the halves of a round, on the same state, sockets and log.
type kubeDaemon struct {
	c                         *kcluster.Cluster
	bin, run, logDir, zdsSock string
	cur                       *daemon
	mode                      string
	// log is the daemon's log, appended to by every start; mark is its
	// size when the current daemon started.
	log  string
	mark int64
	// pid is the current process's, for the CPU sampler.
	pid atomic.Int64
}

func (k *kubeDaemon) socket() string { return filepath.Join(k.run, "sock", "nftredir.sock") }

func (k *kubeDaemon) logSize() int64 {
	fi, err := os.Stat(k.log)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// start starts the daemon in enrolment mode and waits until it serves
// (in NRI mode, registered with the runtime) and, with waitProxy, until
// the node proxy has its snapshot.
func (k *kubeDaemon) start(ctx context.Context, mode string, waitProxy bool) error {
	k.log = filepath.Join(k.logDir, "nftredird-kube.log")
	k.mark = k.logSize()
	d, err := startKubeDaemon(k.c, k.bin, k.run, k.log, k.zdsSock, mode)
	if err != nil {
		return fmt.Errorf("start nftredird in Kubernetes mode (--enrolment %s): %w", mode, err)
	}
	k.cur, k.mode = d, mode
	k.pid.Store(int64(d.pid()))
	if _, err := d.waitServing(ctx, 2*time.Minute); err != nil {
		return err
	}
	if mode == defaults.EnrolmentNRI {
		if _, err := waitLogLine(ctx, k.log, k.mark, 30*time.Second, func(l map[string]any) bool {
			return l["@message"] == "registered with the runtime's NRI"
		}); err != nil {
			return fmt.Errorf("nftredird (--enrolment nri) not registered with containerd's NRI: %w", err)
		}
	}
	if waitProxy {
		return k.waitProxy(ctx, k.mark)
	}
	return nil
}

// waitProxy waits until the daemon has sent the node proxy its snapshot
// since the log's mark.
func (k *kubeDaemon) waitProxy(ctx context.Context, mark int64) error {
	_, err := waitLogLine(ctx, k.log, mark, time.Minute, func(l map[string]any) bool { return l["@message"] == "snapshot sent" })
	if err != nil {
		return fmt.Errorf("the node proxy did not connect to nftredird: %w", err)
	}
	return nil
}

// restart stops the daemon and starts it in enrolment mode, and returns
// how long it took until it served with the node proxy connected.
func (k *kubeDaemon) restart(ctx context.Context, mode string) (time.Duration, error) {
	t0 := time.Now()
	if err := k.stop(); err != nil {
		return 0, err
	}
	if err := k.start(ctx, mode, true); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func (k *kubeDaemon) stop() error {
	if k.cur == nil {
		return nil
	}
	d := k.cur
	k.cur = nil
	return d.stop()
}

// waitLogLine waits until a JSON line after mark in the log at path
// satisfies match, and returns it.
func waitLogLine(ctx context.Context, path string, mark int64, limit time.Duration, match func(map[string]any) bool) (map[string]any, error) {
	deadline := time.Now().Add(limit)
	for {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(io.NewSectionReader(f, mark, math.MaxInt64-mark))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l map[string]any
			if json.Unmarshal(sc.Bytes(), &l) == nil && match(l) {
				f.Close()
				return l, nil
			}
		}
		f.Close()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no such line in %s within %s", path, limit)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startPod creates a standin app pod on the node and waits, through a
// watch, until it is Ready.
func startPod(ctx context.Context, c *kcluster.Cluster, ns, name, image string) (podStart, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      c.NodeName,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullNever,
				Args: []string{"app", "-port", "8080", "-name", name},
			}},
		},
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w, err := c.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return podStart{}, err
	}
	defer w.Stop()
	t0 := time.Now()
	got, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return podStart{}, fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	for {
		select {
		case <-ctx.Done():
			return podStart{}, fmt.Errorf("pod %s/%s not Ready within a minute", ns, name)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return podStart{}, fmt.Errorf("watch of pod %s/%s ended", ns, name)
			}
			if ev.Type == watch.Error {
				return podStart{}, fmt.Errorf("watch of pod %s/%s: %v", ns, name, apierrors.FromObject(ev.Object))
			}
			if pod, ok := ev.Object.(*corev1.Pod); ok && kcluster.PodReady(pod) {
				return podStart{name: name, uid: string(got.UID), ready: time.Since(t0)}, nil
			}
		}
	}
}

// podGap is the pause between one pod's teardown and the next pod's
// start.
const podGap = 250 * time.Millisecond

// waitSandboxStopped waits until containerd has stopped every sandbox of
// the pod (its CNI DEL done, its pause container gone).
func waitSandboxStopped(ctx context.Context, rs runtimeapi.RuntimeServiceClient, uid string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
			LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
		}})
		if err != nil {
			return err
		}
		ready := 0
		for _, sb := range l.Items {
			if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
				ready++
			}
		}
		if ready == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s: sandbox still ready a minute after its deletion", uid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deletePods deletes the pods at once and waits until they are gone: their
// CNI DELs are done before the next variant's pods start.
func deletePods(ctx context.Context, c *kcluster.Cluster, ns string, names []string) error {
	for _, n := range names {
		err := c.Client.CoreV1().Pods(ns).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pods in %s still there a minute after their deletion", len(l.Items), ns)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// taskCPU is the CPU time process pid has used so far, over all its
// threads, including those that exited; 0 when it cannot be read. It is
// read from the process's CPU-time clock (clock_getcpuclockid(3)): one
// system call with the scheduler's nanoseconds, where summing
// /proc/PID/task/*/schedstat took a directory read and a file per thread,
// and the sampler doing that every 5 ms took 11-15% of the busy CPU of a
// pod's CNI window on the node it measures. /proc/PID/stat's ticks are
// 10 ms.
func taskCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(processCPUClock(pid), &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// processCPUClock is the clock id of process pid's CPU time, as glibc's
// clock_getcpuclockid makes it: the pid's complement shifted left by 3,
// with CPUCLOCK_SCHED (2) and without the per-thread bit (4).
func processCPUClock(pid int) int32 {
	const cpuClockSched = 2
	return int32(^pid)<<3 | cpuClockSched
}

// cpuP50 is the p50 of the variant's pods' proxy (or daemon) CPU, from
// Create to Ready or, with sandbox, during RunPodSandbox.
func (r *podStartResult) cpuP50(variant string, proxy, sandbox bool) float64 {
	var ds []time.Duration
	for _, p := range r.pods {
		if p.variant != variant {
			continue
		}
		switch {
		case proxy && sandbox:
			ds = append(ds, p.sbProxyCPU)
		case proxy:
			ds = append(ds, p.proxyCPU)
		case sandbox:
			ds = append(ds, p.sbDaemonCPU)
		default:
			ds = append(ds, p.daemonCPU)
		}
	}
	return p50ms(ds)
}

// cpuSampleEvery is how often the daemon's and the proxy's CPU time is
// read while pods start, to charge it to each pod's RunPodSandbox.
const cpuSampleEvery = 5 * time.Millisecond

// cpuSample is two processes' CPU time at one moment.
type cpuSample struct {
	at            time.Time
	daemon, proxy time.Duration
}

// cpuSampler samples a daemon's and a proxy's CPU time until stopped.
type cpuSampler struct {
	samples []cpuSample
	quit    chan struct{}
	done    chan struct{}
}

// sampleCPU samples the daemon whose pid daemonPID holds now: the
// daemon restarts between the halves of a round, and no window read
// afterwards spans a restart.
func sampleCPU(daemonPID *atomic.Int64, proxyPID int, every time.Duration) *cpuSampler {
	s := &cpuSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			s.samples = append(s.samples, cpuSample{time.Now(), taskCPU(int(daemonPID.Load())), taskCPU(proxyPID)})
			select {
			case <-tick.C:
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

func (s *cpuSampler) stop() {
	close(s.quit)
	<-s.done
}

// within is the CPU each process used between from and to, interpolated
// between the samples around them; zero outside the sampled time.
func (s *cpuSampler) within(from, to time.Time) (daemon, proxy time.Duration) {
	d0, p0, ok0 := s.at(from)
	d1, p1, ok1 := s.at(to)
	if !ok0 || !ok1 {
		return 0, 0
	}
	return d1 - d0, p1 - p0
}

func (s *cpuSampler) at(t time.Time) (daemon, proxy time.Duration, ok bool) {
	i, _ := slices.BinarySearchFunc(s.samples, t, func(c cpuSample, t time.Time) int { return c.at.Compare(t) })
	if i == 0 || i >= len(s.samples) {
		return 0, 0, false
	}
	a, b := s.samples[i-1], s.samples[i]
	f := float64(t.Sub(a.at)) / float64(b.at.Sub(a.at))
	lerp := func(x, y time.Duration) time.Duration { return x + time.Duration(f*float64(y-x)) }
	return lerp(a.daemon, b.daemon), lerp(a.proxy, b.proxy), true
}

// aloneGap is the pause before each standalone AddPod of the pod start
// section.
const aloneGap = 250 * time.Millisecond

// aloneAddPods enrols cfg.psPods fresh namespaces through the standalone
// daemon, one after another, and returns its log lines of them and the
// end-to-end times; the namespaces are released and removed after.
func (b *bench) aloneAddPods(ctx context.Context, d *daemon, round int) ([]callLine, []time.Duration, error) {
	n := b.cfg.psPods * 2
	names, err := b.pool.create(n, fmt.Sprintf("ps%d", round))
	if err != nil {
		return nil, nil, err
	}
	defer b.pool.remove(names)
	uid := func(i int) string { return fmt.Sprintf("ps-%d-%s", round, names[i][len(b.pool.prefix):]) }
	mark := d.logSize()
	var e2e []time.Duration
	for i := range n {
		// Each call finds the daemon idle, as a pod start's does: calls
		// back to back run on warm caches and a running scheduler, and
		// take measurably less (lock, open, record and finish alike).
		b.sleep(ctx, aloneGap)
		t0 := time.Now()
		if _, err := d.client.AddPod(ctx, addRequest(uid(i), names[i], podIP(names[i]))); err != nil {
			return nil, nil, fmt.Errorf("AddPod %s: %w", names[i], err)
		}
		e2e = append(e2e, time.Since(t0))
	}
	var lines []callLine
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		lines, err = d.addPodLines(mark, d.logSize())
		if err != nil || len(lines) >= n || time.Now().After(deadline) {
			break
		}
	}
	if err == nil && len(lines) != n {
		err = fmt.Errorf("the daemon's log shows %d AddPod calls, want %d", len(lines), n)
	}
	for i := range n {
		if _, rerr := d.client.RemovePod(ctx, uid(i)); rerr != nil && err == nil {
			err = rerr
		}
	}
	return lines, e2e, err
}

// startKubeDaemon starts nftredird in Kubernetes mode in the cluster's
// node namespace, with the admin kubeconfig (RBAC is not on its hot
// path: the informers and patches are the same calls either way),
// enrolling through enrolment: with NRI, on the cluster's NRI socket and
// with its gate file in run, not the node's.
func startKubeDaemon(c *kcluster.Cluster, bin, run, logPath, zdsSock, enrolment string) (*daemon, error) {
	d := &daemon{
		socket:   filepath.Join(run, "sock", "nftredir.sock"),
		stateDir: filepath.Join(run, "state"),
		logPath:  logPath,
		exited:   make(chan struct{}),
	}
	args := []string{
		"--socket", d.socket,
		"--state-dir", d.stateDir,
		"--log-format", "json",
		"--reconcile-interval", "1h",
		"--metrics-address=",
		"--kubernetes", "--kubeconfig", c.AdminKubeconfig, "--node-name", c.NodeName,
		// Nothing of an older daemon to move in.
		"--kubernetes-state-dir=",
		"--zds-socket", zdsSock,
		"--enrolment", enrolment,
	}
	if enrolment != defaults.EnrolmentCNI {
		args = append(args, "--nri-socket", c.NRISocket, "--nri-gate-file", filepath.Join(run, "nri-gate"))
	}
	return d, d.launch(c.NodeCommand(bin, args...))
}

// standInProxy connects to the ZDS socket as a node proxy would and acks
// every request, until the run ends; when the daemon restarts, it
// connects again, as ztunnel does.
func standInProxy(t *progTB, path string) {
	serve := func() {
		var p *zdstest.Peer
		var err error
		for t.Context().Err() == nil {
			if p, err = zdstest.Connect(t, path); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if p == nil {
			return
		}
		if err := p.Write(zdstest.HelloMsg(1)); err != nil {
			return
		}
		for t.Context().Err() == nil {
			req, err := p.Recv(time.Second)
			if err != nil {
				if errors.Is(err, zdstest.ErrClosed) {
					return
				}
				continue // a read timeout: look at the context again
			}
			zdstest.CloseFds(req)
			if err := p.Write(zdstest.AckMsg("")); err != nil {
				return
			}
		}
	}
	go func() {
		for t.Context().Err() == nil {
			serve()
		}
	}()
}

// execTiming is a command timed from exec to exit.
type execTiming struct {
	bin   string // empty: not timed
	args  []string
	env   []string
	stdin string
}

func (e execTiming) run() (time.Duration, error) {
	cmd := exec.Command(e.bin, e.args...)
	cmd.Env = e.env
	cmd.Stdin = strings.NewReader(e.stdin)
	t0 := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%s %s: %v: %s", e.bin, strings.Join(e.args, " "), err, b)
	}
	return time.Since(t0), nil
}

// execSamples is how often the pod start section times each bare exec:
// the differences it reports are a fraction of a millisecond.
const execSamples = 100

// timeExecs runs each timing n times, turn about, so that the machine's
// drift weighs on all alike; a timing without a binary gets no samples.
func timeExecs(n int, timings ...execTiming) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(timings))
	for range n {
		for i, e := range timings {
			if e.bin == "" {
				continue
			}
			d, err := e.run()
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], d)
		}
	}
	return out, nil
}

// minimalGoProgram is the pause program make build puts next to this
// one, or "" when it is not there.
func minimalGoProgram() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), "pause")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// smallestProgram is the system's true(1), or "" when PATH has none.
func smallestProgram() string {
	p, err := exec.LookPath("true")
	if err != nil {
		return ""
	}
	return p
}

// containerd's log lines around a sandbox (logrus text format, the
// sandbox's metadata in protobuf text format, whose attempt is left out
// when 0); the CNI chain's lines are logged at debug:
//
//	time="..." level=info msg="RunPodSandbox for name:\"p\" uid:\"U\" namespace:\"n\""
//	time="..." level=debug msg="begin cni setup" podsandboxid=ID
//	time="..." level=debug msg="cni result: {...}" podsandboxid=ID
//	time="..." level=info msg="RunPodSandbox for name:\"p\" uid:\"U\" namespace:\"n\" returns sandbox id \"ID\""
//
// The protobuf library varies the spaces between fields from one build
// to another, so the pattern takes any run of them.
var (
	sandboxLine = regexp.MustCompile(`^time="([^"]+)".*msg="RunPodSandbox for name: *\\"[^"\\]*\\" +uid: *\\"([^"\\]*)\\" +namespace: *\\"[^"\\]*\\" *( returns sandbox id \\"([0-9a-f]+)\\")?"`)
	cniLine     = regexp.MustCompile(`^time="([^"]+)" level=debug msg="(begin cni setup|cni result: ).*" podsandboxid=([0-9a-f]+)$`)
)

// sandboxTimes reads each first-attempt sandbox's RunPodSandbox time, and
// its CNI chain's within it, by pod UID, from containerd's log.
func sandboxTimes(path string) (map[string]sandboxWindow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSandboxTimes(f)
}

// sandboxWindow is when one sandbox's RunPodSandbox ran, and how long its
// CNI ADD took (0 when containerd did not log it).
type sandboxWindow struct {
	start, end time.Time
	cni        time.Duration
}

func (w sandboxWindow) d() time.Duration { return w.end.Sub(w.start) }

func parseSandboxTimes(r io.Reader) (map[string]sandboxWindow, error) {
	begun := map[string]time.Time{}
	out := map[string]sandboxWindow{}
	uidOf := map[string]string{} // sandbox ID → pod UID
	cniBegun, cniDone := map[string]time.Time{}, map[string]time.Time{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	parse := func(s string) (time.Time, error) {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return at, fmt.Errorf("containerd log time %q: %w", s, err)
		}
		return at, nil
	}
	for sc.Scan() {
		line := sc.Text()
		if m := cniLine.FindStringSubmatch(line); m != nil {
			at, err := parse(m[1])
			if err != nil {
				return nil, err
			}
			if m[2] == "begin cni setup" {
				cniBegun[m[3]] = at
			} else {
				cniDone[m[3]] = at
			}
			continue
		}
		m := sandboxLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := parse(m[1])
		if err != nil {
			return nil, err
		}
		if m[3] == "" {
			begun[m[2]] = at
		} else if t0, ok := begun[m[2]]; ok {
			out[m[2]] = sandboxWindow{start: t0, end: at}
			uidOf[m[4]] = m[2]
		}
	}
	for id, uid := range uidOf {
		t0, ok0 := cniBegun[id]
		t1, ok1 := cniDone[id]
		if w := out[uid]; ok0 && ok1 && !t1.Before(t0) {
			w.cni = t1.Sub(t0)
			out[uid] = w
		}
	}
	return out, sc.Err()
}

// addPodLines reads, from the daemon's log between two marks, each
// AddPod's time in the daemon and its phases (calltrace).
func (d *daemon) addPodLines(from, to int64) ([]callLine, error) {
	lines, err := readCallLines(d.logPath, from, to)
	return slices.DeleteFunc(lines, func(l callLine) bool { return l.pod != "" }), err
}

// readCallLines reads, from a daemon's log between two marks, each
// AddPod the gRPC server logged (grpc.time_ms, from its first
// interceptor to the handler's return) and each RunPodSandbox the NRI
// handler logged (its time in the handler, the pod and whether it was
// captured), with their phases (calltrace).
func readCallLines(path string, from, to int64) ([]callLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []callLine
	sc := bufio.NewScanner(io.NewSectionReader(f, from, to-from))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		var l callLine
		var ms float64
		var ok bool
		switch {
		case line["grpc.method"] == "AddPod":
			ms, ok = number(line["grpc.time_ms"])
		case line[nri.EventField] == "RunPodSandbox":
			ms, ok = number(line[nri.TimeField])
			l.pod, _ = line["pod"].(string)
			l.captured, _ = line["captured"].(bool)
			ok = ok && l.pod != ""
		}
		if !ok {
			continue
		}
		l.total, l.phases = time.Duration(ms*float64(time.Millisecond)), map[string]float64{}
		for k, v := range line {
			name, ok := strings.CutPrefix(k, calltrace.FieldPrefix)
			if !ok {
				continue
			}
			if x, ok := number(v); ok {
				l.phases[strings.TrimSuffix(name, "_ms")] = x
			}
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

func number(v any) (float64, bool) {
	switch v := v.(type) {
	case float64:
		return v, true
	case string:
		x, err := strconv.ParseFloat(v, 64)
		return x, err == nil
	}
	return 0, false
}

// nftredir-cni's log line for an ADD (hclog text format), e.g.
// "... [INFO]  nftredir-cni: pod enrolled: pid=1 ... call_ms=1.234 run_ms=2.345".
var pluginLineRE = regexp.MustCompile(`nftredir-cni: (pod enrolled|pod not captured)[^\n]* call_ms=([0-9.]+) run_ms=([0-9.]+)`)

func pluginLines(path string) ([]pluginLine, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []pluginLine
	for _, m := range pluginLineRE.FindAllStringSubmatch(string(b), -1) {
		call, _ := strconv.ParseFloat(m[2], 64)
		run, _ := strconv.ParseFloat(m[3], 64)
		out = append(out, pluginLine{captured: m[1] == "pod enrolled", call: call, run: run})
	}
	return out, nil
}

// phaseP50 is the p50 of one phase over lines (0 when no line has it).
func phaseP50(lines []callLine, phase string) float64 {
	var v []float64
	for _, l := range lines {
		if x, ok := l.phases[phase]; ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

func totalP50(lines []callLine) float64 {
	ds := make([]time.Duration, len(lines))
	for i, l := range lines {
		ds[i] = l.total
	}
	return p50ms(ds)
}

// phaseOrder lists the phases the lines show, in the daemon's order.
func phaseOrder(groups ...[]callLine) []string {
	known := []string{"enrolled", "lock", "open", "pod_lookup", "sighting", "namespace_lookup", "admit", "release", "record", "kernel", "finish", "probe", "zds", "policy_added"}
	seen := map[string]bool{}
	for _, g := range groups {
		for _, l := range g {
			for k := range l.phases {
				seen[k] = true
			}
		}
	}
	var out []string
	for _, k := range known {
		if seen[k] {
			out = append(out, k)
			delete(seen, k)
		}
	}
	out = append(out, slices.Sorted(maps.Keys(seen))...)
	return out
}

// phaseText says what each calltrace phase of AddPod covers.
var phaseText = map[string]string{
	"enrolled":         "NRI: the sandbox's AddPod; is the pod enrolled through it already",
	"lock":             "validate + the pod's lock",
	"open":             "open + check the netns",
	"pod_lookup":       "policy: find the pod (informer cache, else a GET)",
	"sighting":         "policy: remember the pod's netns (in memory; its file is written after the answer)",
	"namespace_lookup": "policy: find its namespace (informer cache, else a GET)",
	"admit":            "policy: options, ignored-annotation Events, request",
	"release":          "not captured: release if enrolled",
	"record":           "build ruleset, read + claim + write the record",
	"kernel":           "enter the netns (its netlink sockets, where open did not), ip rule + route, nft table",
	"finish":           "publish to watchers",
	"probe":            "node probe set",
	"zds":              "hand the pod to the node proxy",
	"policy_added":     "policy: queue the annotation, Events of a failure",
}
