package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
)

// Pod start as the kubelet sees it: the project's real single-node
// cluster (internal/kcluster: kubelet, containerd, bridge + host-local),
// pods on the bare chain, and on the chain with nftredir-cni appended in
// a namespace outside the mesh and in one inside it, with nftredird in
// Kubernetes mode and a node proxy connected over ZDS. Each pod starts
// alone on the node, the three variants taking turns, in one cluster, so
// that the machine's drift weighs on all of them; they are reported as
// differences and ratios to the bare chain of the same run.

// The pod start section's variants.
const (
	psBare     = "bridge + host-local"
	psOut      = "+ nftredir-cni, pod not captured"
	psCaptured = "+ nftredir-cni, pod captured"
)

var psVariants = []string{psBare, psOut, psCaptured}

// psOrders are the orders of psVariants' indexes the pod start section
// cycles through: all six.
var psOrders = [][3]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {2, 1, 0}, {1, 0, 2}}

// The section's targets: what capture may add to a pod's sandbox, and
// what Kubernetes mode may add to AddPod in the daemon.
const (
	maxCapturedExtraMS = 5.0
	maxOutExtraMS      = 1.0
	maxKubeAddRatio    = 1.25
)

var (
	goalPSCaptured = fmt.Sprintf("captured pod's RunPodSandbox ≤ bare chain's + %g ms (p50s)", maxCapturedExtraMS)
	goalPSOut      = fmt.Sprintf("not-captured pod's RunPodSandbox ≤ bare chain's + %g ms (p50s)", maxOutExtraMS)
	goalKubeAdd    = fmt.Sprintf("AddPod in the daemon in Kubernetes mode (captured) ≤ %g× standalone with the same ruleset (p50s)", maxKubeAddRatio)
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

// callLine is one AddPod as the daemon logged it.
type callLine struct {
	total  time.Duration
	phases map[string]float64 // ms, by calltrace phase
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
	// kube holds the Kubernetes-mode daemon's AddPods, by variant
	// (psOut, psCaptured); alone the standalone daemon's, sequential, in
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
	load         []float64
}

// psMetric is one of the times taken of each pod start.
type psMetric int

const (
	// mSandbox is containerd's RunPodSandbox: what the kubelet waits for.
	mSandbox psMetric = iota
	// mCNI is the CNI chain's ADD within it, as containerd timed it.
	mCNI
	// mRest is RunPodSandbox outside the chain (the sandbox's namespace,
	// the pause container through runc and its shim): the same work for
	// every variant, and most of the run's noise.
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
// bare chain's p50 of the same round.
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
// the bare chain's.
func (r *podStartResult) pooledVs(variant string, m psMetric, ratio bool) float64 {
	v, b := p50ms(r.durations(variant, -1, m)), p50ms(r.durations(psBare, -1, m))
	if ratio {
		return v / b
	}
	return v - b
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

func (b *bench) podStart(t *progTB, alone, same *daemon, binDir string, r *podStartResult) {
	// The daemon's state, its Kubernetes state and sockets on the run's
	// tmpfs, as /run is on a node; the plugin's data dir and logs on disk,
	// as /var/lib and /var/log are. The dir is made before the cluster so
	// that it is removed after the cluster's teardown, whose CNI DELs
	// still run the plugin, which logs there.
	dir, run := t.TempDir(), filepath.Join(b.work, "kube")
	begin := time.Now()
	b.progress("pod start: starting the cluster (internal/kcluster)")
	c := kcluster.Start(t, kcluster.Options{ContainerdDebug: true})
	r.clusterUp = time.Since(begin)
	c.InstallCNIPlugin(t, "nftredir-cni", filepath.Join(binDir, "nftredir-cni"))
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	zdsSock := filepath.Join(run, "zds.sock")
	cniLog := filepath.Join(dir, "cni.log")

	// nftredird in Kubernetes mode, as a host process in the node's
	// namespace, its flags as the e2e suite's mesh cluster gives them.
	kd, err := startKubeDaemon(c, b.cfg.daemon, run, dir, zdsSock)
	if err != nil {
		t.Fatalf("start nftredird in Kubernetes mode: %v", err)
	}
	t.Cleanup(func() {
		if err := kd.stop(); err != nil {
			t.Errorf("stop the Kubernetes-mode daemon: %v", err)
		}
	})
	if _, err := kd.waitServing(t.Context(), 2*time.Minute); err != nil {
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
		if err := standInProxy(t, zdsSock); err != nil {
			t.Fatalf("stand-in node proxy: %v", err)
		}
		r.proxy = "a stand-in that acks every pod over ZDS (set " + istiotest.ZtunnelEnv + " for stock ztunnel)"
	}

	withPlugin := map[string]any{
		"type":              "nftredir-cni",
		"socket":            kd.socket,
		"timeout":           "10s",
		"excludeNamespaces": []string{"kube-system", "istio-system"},
		"logFile":           cniLog,
		"dataDir":           filepath.Join(dir, "cni-data"),
	}
	nss := map[string]string{psBare: "ps-bare", psOut: "ps-out", psCaptured: "ps-mesh"}
	c.CreateNamespace(t, nss[psBare], nil)
	c.CreateNamespace(t, nss[psOut], nil)
	c.CreateNamespace(t, nss[psCaptured], map[string]string{kube.DefaultModeLabel: kube.DefaultModeEnabled})
	image := c.Standin(t)

	chain := ""
	useChain := func(name string) {
		if chain == name {
			return
		}
		if name == psBare {
			c.WriteConflist(t)
		} else {
			c.WriteConflist(t, withPlugin)
		}
		chain = name
	}
	kubeMark := kd.logSize()
	// The daemon's and the proxy's CPU, sampled through the rounds, so
	// that what they used during each sandbox can be read afterwards.
	cpu := sampleCPU(kd.cmd.Process.Pid, proxyPID, cpuSampleEvery)
	cri := c.CRI(t)
	for round := range r.rounds {
		r.load = append(r.load, loadAvg())
		b.progress("pod start, round %d/%d: %d pods per variant, one at a time (load %.2f)", round+1, r.rounds, r.perRound, loadAvg())
		first := len(r.pods)
		for i := range r.perRound {
			// One pod of each variant, each alone on the node: created,
			// Ready, deleted and torn down before the next, so that no
			// variant starts beside more pods than another. The orders
			// cycle through every permutation, so that each variant goes
			// first, and follows each other one, as often as the rest:
			// the machine's drift and what one pod's teardown leaves
			// behind weigh on all of them alike.
			order := psOrders[(round*r.perRound+i)%len(psOrders)]
			for j, vi := range order {
				v := psVariants[vi]
				useChain(map[bool]string{true: psBare, false: "nftredir"}[v == psBare])
				name := fmt.Sprintf("ps%d-%d-%d", round, i, j)
				proxy0, daemon0 := taskCPU(proxyPID), taskCPU(kd.cmd.Process.Pid)
				ps, err := startPod(t.Context(), c, nss[v], name, image)
				if err != nil {
					t.Fatalf("%s: %v", v, err)
				}
				ps.daemonCPU = taskCPU(kd.cmd.Process.Pid) - daemon0
				if proxyPID != 0 {
					ps.proxyCPU = taskCPU(proxyPID) - proxy0
				}
				ps.variant, ps.round = v, round
				r.pods = append(r.pods, ps)
				if err := deletePods(t.Context(), c, nss[v], []string{name}); err != nil {
					t.Fatal(err)
				}
				if err := waitSandboxStopped(t.Context(), cri, ps.uid); err != nil {
					t.Fatal(err)
				}
				// Let what the teardown set off (the kubelet's, the
				// daemon's and the proxy's reactions) settle.
				b.sleep(t.Context(), podGap)
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
	lines, err := kd.addPodLines(kubeMark, kd.logSize())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		v := psOut
		if _, ok := l.phases["kernel"]; ok {
			v = psCaptured
		}
		r.kube[v] = append(r.kube[v], l)
	}
	if r.plugin, err = pluginLines(cniLog); err != nil {
		t.Fatal(err)
	}
	want := r.rounds * r.perRound
	if n := len(r.kube[psCaptured]); n != want {
		t.Fatalf("the Kubernetes-mode daemon logged %d captured AddPods, want %d", n, want)
	}
	if n := len(r.kube[psOut]); n != want {
		t.Fatalf("the Kubernetes-mode daemon logged %d not-captured AddPods, want %d", n, want)
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

func sampleCPU(daemonPID, proxyPID int, every time.Duration) *cpuSampler {
	s := &cpuSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			s.samples = append(s.samples, cpuSample{time.Now(), taskCPU(daemonPID), taskCPU(proxyPID)})
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
// path: the informers and patches are the same calls either way).
func startKubeDaemon(c *kcluster.Cluster, bin, run, logDir, zdsSock string) (*daemon, error) {
	d := &daemon{
		socket:   filepath.Join(run, "sock", "nftredir.sock"),
		stateDir: filepath.Join(run, "state"),
		logPath:  filepath.Join(logDir, "nftredird-kube.log"),
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
	}
	return d, d.launch(c.NodeCommand(bin, args...))
}

// standInProxy connects to the ZDS socket as a node proxy would and acks
// every request, until the run ends.
func standInProxy(t *progTB, path string) error {
	var p *zdstest.Peer
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if p, err = zdstest.Connect(t, path); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := p.Write(zdstest.HelloMsg(1)); err != nil {
		return err
	}
	go func() {
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
	}()
	return nil
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
	f, err := os.Open(d.logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []callLine
	sc := bufio.NewScanner(io.NewSectionReader(f, from, to-from))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["grpc.method"] != "AddPod" {
			continue
		}
		ms, ok := number(line["grpc.time_ms"])
		if !ok {
			continue
		}
		l := callLine{total: time.Duration(ms * float64(time.Millisecond)), phases: map[string]float64{}}
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
	known := []string{"lock", "open", "pod_lookup", "sighting", "namespace_lookup", "admit", "release", "record", "kernel", "finish", "probe", "zds", "policy_added"}
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
	"lock":             "validate + the pod's lock",
	"open":             "open + check the netns",
	"pod_lookup":       "policy: find the pod (informer cache, else a GET)",
	"sighting":         "policy: remember the pod's netns (in memory; its file is written after the answer)",
	"namespace_lookup": "policy: find its namespace (informer cache, else a GET)",
	"admit":            "policy: options, ignored-annotation Events, request",
	"release":          "not captured: release if enrolled",
	"record":           "build ruleset, read + claim + write the record",
	"kernel":           "ip rule + route, nft table",
	"finish":           "publish to watchers",
	"probe":            "node probe set",
	"zds":              "hand the pod to the node proxy",
	"policy_added":     "policy: queue the annotation, Events of a failure",
}
