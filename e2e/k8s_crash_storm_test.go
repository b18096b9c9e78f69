package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/kube"
)

// The crash storm's knobs. The short run is part of the cluster suite;
// make crash-storm runs the long one (CRASH_STORM_KILLS=200 and more).
const (
	stormKillsEnv   = "CRASH_STORM_KILLS"
	stormSeedEnv    = "CRASH_STORM_SEED"
	stormShortKills = 12
)

// The storm's world: three namespaces whose label goes in and out of the
// mesh, and one never in it, for a pod annotated by someone else.
var (
	stormChaosNamespaces = []string{"storm-a", "storm-b", "storm-c"}
	stormForeignNS       = "storm-foreign"
)

const (
	// stormRoleLabel tells the storm's pods apart: "chaos" pods are
	// created, deleted and relabelled; "foreign" pods carry a redirection
	// annotation someone else wrote and are never selected.
	stormRoleLabel = "crash-storm"
	stormMinPods   = 3
	stormMaxPods   = 8
	// stormTeardownGrace is the daemon's --teardown-grace here: the
	// runtime deletes a pod's namespace within milliseconds of its CNI
	// DEL, and a short grace lets a settle include the leftovers' cleanup.
	stormTeardownGrace = 2 * time.Second
	// stormQuiet is how long everything the checks read must stay the
	// same before the node counts as settled. Longer than the teardown
	// grace: a record left for teardown when the quiet began was due, and
	// its cleanup would have broken the quiet.
	stormQuiet = 3 * time.Second
	// stormSettleBound bounds a settle, far beyond the kubelet's retry of
	// a pod sandbox that failed (about 10 s).
	stormSettleBound = 90 * time.Second
	stormMetrics     = "127.0.0.1:19918"
	// stormKubeletUID: the probe table is on, for a uid nothing here runs
	// as (as in TestK8sNodeReboot).
	stormKubeletUID = "4242"
)

// TestK8sCrashStorm SIGKILLs nftredird in Kubernetes mode at random points
// (during its startup reconcile, in the middle of a burst of operations,
// at rest) while, concurrently and at random, namespaces are labelled into
// and out of the mesh, pods are labelled out (none), in (ambient) and
// back, pods are created and deleted, and the node proxy (a ZDS peer that
// acks) disconnects and reconnects. After each restart settles (see
// settle), it checks what a node must look like (see violations) and
// counts every departure. The seed is printed; CRASH_STORM_SEED replays
// the same choices (the timing of the cluster's own work still varies).
func TestK8sCrashStorm(t *testing.T) {
	kills := stormShortKills
	if v := os.Getenv(stormKillsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of kill points", stormKillsEnv, v)
		}
		kills = n
	}
	seed := rand.Uint64()
	if v := os.Getenv(stormSeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", stormSeedEnv, v)
		}
		seed = n
	}
	t.Logf("crash storm: %d kill points, seed %d (%s=%d %s=%d replays its choices)", kills, seed, stormKillsEnv, kills, stormSeedEnv, seed)

	m := newMeshCluster(t)
	for _, ns := range stormChaosNamespaces {
		m.CreateNamespace(t, ns, nil)
	}
	m.CreateNamespace(t, stormForeignNS, nil)
	m.startMesh(t, "--metrics-address", stormMetrics, "--teardown-grace", stormTeardownGrace.String(),
		"--probe-snat=true", "--kubelet-uid", stormKubeletUID, "--node-netns", m.Netns.Path)
	s := newStorm(t, m, seed)
	s.populate(t)
	s.proxy = startStormProxy(t, m.zds)

	// The daemon startMesh started is SERVING: the first check is of the
	// node before any kill, which must find nothing.
	s.launched = &stormLaunch{at: time.Now(), exited: m.daemon.exited, first: true}
	s.launched.servingAt.Store(time.Now().UnixNano())
	s.settleAndCheck(t)
	for s.kills < kills {
		if s.kills > 0 && s.rng.Float64() < 0.35 {
			s.killDuringStartup(t)
			continue
		}
		if s.kills > 0 {
			s.settleAndCheck(t)
		}
		if s.rng.Float64() < 0.6 {
			s.killDuringBurst(t)
		} else {
			s.killAtRest(t)
		}
	}
	s.settleAndCheck(t)
	s.report(t, kills)
}

// storm is the state of one crash storm.
type storm struct {
	m    *meshCluster
	api  *client.Client
	cri  runtimeapi.RuntimeServiceClient
	seed uint64
	// rng makes the storm's own choices (where to kill, how long a
	// burst runs); each burst's workers have generators of their own.
	rng   *rand.Rand
	proxy *stormProxy
	tmpl  *corev1.Pod
	// foreign is the redirection annotation the test gave each foreign
	// pod, by uid: nftredir must leave it as it is.
	foreign map[string]string

	// kills counts the kill points so far.
	kills    int
	launched *stormLaunch
	ops      *stormBurst
	podSeq   atomic.Int64

	mu sync.Mutex
	// protects the following fields
	opCounts map[string]*stormOpCount

	killPhases map[string]int
	servings   []time.Duration
	settles    []time.Duration
	checks     int
	violations []stormViolation
	diagnosed  int
}

type stormOpCount struct{ done, failed int }

// stormViolation is one departure from what a settled node must look
// like, found after kill point kill.
type stormViolation struct {
	kill int
	pod  string
	what string
}

func (v stormViolation) String() string {
	if v.pod == "" {
		return fmt.Sprintf("after kill %d: %s", v.kill, v.what)
	}
	return fmt.Sprintf("after kill %d: %s: %s", v.kill, v.pod, v.what)
}

func newStorm(t *testing.T, m *meshCluster, seed uint64) *storm {
	s := &storm{
		m:          m,
		api:        m.daemon.client(t, client.WithRetry(1, 0), client.WithTimeout(5*time.Second), redialAtOnce),
		cri:        m.CRI(t),
		seed:       seed,
		rng:        rand.New(rand.NewPCG(seed, 0)),
		foreign:    map[string]string{},
		opCounts:   map[string]*stormOpCount{},
		killPhases: map[string]int{},
	}
	s.tmpl = m.StandinPod(t, "", "", 0, m.NodeName, "app", "-port", "8080")
	// A burst still running when the test fails must not outlive it.
	t.Cleanup(func() { s.stopBurst() })
	return s
}

// populate makes the pods the storm starts with: two in each chaos
// namespace, and the foreign pods, one in a namespace never in the mesh,
// one opted out in a chaos namespace, both annotated as istio-cni leaves
// its pods. Two of the chaos namespaces start in the mesh.
func (s *storm) populate(t *testing.T) {
	m := s.m
	for i, ns := range stormChaosNamespaces {
		if i != 1 {
			m.label(t, "namespace", "", ns, meshEnabled)
		}
	}
	var names [][2]string
	for _, ns := range stormChaosNamespaces {
		for range 2 {
			p := s.newPod(ns, "")
			if _, err := m.Client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			names = append(names, [2]string{ns, p.Name})
		}
	}
	enabled := map[string]string{kube.RedirectionAnnotation: redirectionEnabled}
	for i, where := range [][2]string{{stormForeignNS, ""}, {stormChaosNamespaces[0], "none"}} {
		p := s.tmpl.DeepCopy()
		p.Namespace, p.Name = where[0], fmt.Sprintf("foreign-%d", i)
		p.Labels = map[string]string{stormRoleLabel: "foreign"}
		if where[1] != "" {
			p.Labels[meshLabel] = where[1]
		}
		p.Annotations = enabled
		p.Spec.Containers[0].Args = []string{"app", "-port", "8080", "-name", p.Name}
		got := m.CreatePod(t, p)
		s.foreign[string(got.UID)] = redirectionEnabled
		names = append(names, [2]string{got.Namespace, got.Name})
	}
	for _, n := range names {
		m.WaitPodReady(t, n[0], n[1])
	}
}

// newPod is a chaos pod of namespace ns with the mesh label value (""
// for none), not yet created.
func (s *storm) newPod(ns, mode string) *corev1.Pod {
	p := s.tmpl.DeepCopy()
	p.Namespace = ns
	p.Name = fmt.Sprintf("p%d", s.podSeq.Add(1))
	p.Labels = map[string]string{stormRoleLabel: "chaos"}
	if mode != "" {
		p.Labels[meshLabel] = mode
	}
	p.Spec.Containers[0].Args = []string{"app", "-port", "8080", "-name", p.Name}
	return p
}

func (s *storm) isStormNamespace(ns string) bool {
	return ns == stormForeignNS || slices.Contains(stormChaosNamespaces, ns)
}

// redialAtOnce makes a client reconnect to a restarted daemon within
// milliseconds: with gRPC's default backoff (1 s at first) a socket that
// comes back is noticed late, and the times to SERVING and to settled
// would be read too long.
var redialAtOnce = client.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1, MaxDelay: 10 * time.Millisecond},
	MinConnectTimeout: time.Second,
}))

// stormLaunch is one start of the daemon, followed by a poller of its
// gRPC health that notes when it first reports SERVING.
type stormLaunch struct {
	at        time.Time
	servingAt atomic.Int64 // UnixNano; 0 until SERVING
	exited    chan struct{}
	// first: the start before the storm, which the test waited for.
	first bool
	stop  context.CancelFunc
}

func (l *stormLaunch) serving() bool { return l.servingAt.Load() != 0 }

// relaunch starts the daemon again on its state, without waiting.
func (s *storm) relaunch(t *testing.T) {
	d := s.m.daemon
	d.launch(t)
	ctx, cancel := context.WithCancel(context.Background())
	l := &stormLaunch{at: time.Now(), exited: d.exited, stop: cancel}
	s.launched = l
	go func() {
		c, err := client.Dial(ctx, d.socket, client.WithRetry(1, 0), redialAtOnce)
		if err != nil {
			return
		}
		defer c.Close()
		for ctx.Err() == nil {
			hctx, hcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			h, err := c.Health(hctx)
			hcancel()
			if err == nil && h.Serving() {
				l.servingAt.Store(time.Now().UnixNano())
				return
			}
			select {
			case <-ctx.Done():
			case <-l.exited:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(cancel)
}

// killNow SIGKILLs the daemon, noting which phase the kill hit: its
// startup (not yet SERVING), a burst of operations (burst names which
// moment of it), or a node at rest;
// and starts it again, at once or after a while, as an init system or
// the kubelet would after a crash.
func (s *storm) killNow(t *testing.T, burst string) {
	l := s.launched
	select {
	case <-l.exited:
		s.violate("", "nftredird exited by itself before this kill point")
	default:
	}
	phase := "at rest"
	switch {
	case !l.serving():
		phase = "startup"
	case s.ops != nil:
		phase = burst
	}
	s.m.daemon.kill(t)
	s.kills++
	if l.stop != nil {
		l.stop()
	}
	s.mu.Lock()
	s.killPhases[phase]++
	s.mu.Unlock()
	// Mostly back at once or within a second and a half; sometimes down
	// for seconds, as a crash loop's backoff keeps it, while pods come
	// and go.
	var down time.Duration
	switch r := s.rng.Float64(); {
	case r < 0.35:
		down = time.Duration(s.rng.Int64N(int64(1500 * time.Millisecond)))
	case r < 0.5:
		down = 1500*time.Millisecond + time.Duration(s.rng.Int64N(int64(3500*time.Millisecond)))
	}
	t.Logf("kill %d: SIGKILL %s after the daemon's start (%s), down for %s", s.kills, time.Since(l.at).Round(time.Millisecond), phase, down.Round(time.Millisecond))
	time.Sleep(down)
	s.relaunch(t)
}

// killDuringStartup kills the daemon that was just started again, within
// about as long as its starts take to reach SERVING.
func (s *storm) killDuringStartup(t *testing.T) {
	typical := time.Second
	if len(s.servings) > 0 {
		typical = percentile(s.servings, 50)
	}
	wait := time.Duration(s.rng.Float64() * float64(typical))
	time.Sleep(time.Until(s.launched.at.Add(wait)))
	s.killNow(t, "burst")
}

// killDuringBurst starts operations, kills the daemon among them, and
// lets them go on for a while across its restart.
func (s *storm) killDuringBurst(t *testing.T) {
	s.startBurst(t)
	if s.rng.IntN(2) == 0 {
		time.Sleep(time.Duration(s.rng.Int64N(int64(3 * time.Second))))
		s.killNow(t, "burst")
	} else {
		// Just after a namespace or pod label changed, when the agent is
		// enrolling or releasing the pods it affects: a random moment of
		// the burst seldom falls inside that work, which takes
		// milliseconds.
		select {
		case <-s.ops.relabelled:
		case <-time.After(3 * time.Second):
		}
		time.Sleep(time.Duration(s.rng.Int64N(int64(100 * time.Millisecond))))
		s.killNow(t, "burst, after a relabel")
	}
	s.ops.until(time.Now().Add(time.Duration(s.rng.Int64N(int64(2 * time.Second)))))
}

// killAtRest kills the daemon on a settled node, sometimes with the proxy
// just hanging up.
func (s *storm) killAtRest(t *testing.T) {
	if s.rng.IntN(2) == 0 {
		s.proxy.flap(time.Duration(s.rng.Int64N(int64(time.Second))))
		s.count("proxy reconnect", nil)
	}
	time.Sleep(time.Duration(s.rng.Int64N(int64(2 * time.Second))))
	s.killNow(t, "burst")
}

func (s *storm) count(kind string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.opCounts[kind]
	if c == nil {
		c = &stormOpCount{}
		s.opCounts[kind] = c
	}
	c.done++
	if err != nil {
		c.failed++
	}
}

func (s *storm) violate(pod, what string) {
	s.mu.Lock()
	s.violations = append(s.violations, stormViolation{kill: s.kills, pod: pod, what: what})
	s.mu.Unlock()
}

// stormBurst is a burst of operations run by two workers until its end.
type stormBurst struct {
	mu sync.Mutex
	// protects end
	end time.Time

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// relabelled is signalled after a label change.
	relabelled chan struct{}
}

// relabel signals a label change that went through.
func (b *stormBurst) relabel(err error) {
	if err != nil {
		return
	}
	select {
	case b.relabelled <- struct{}{}:
	default:
	}
}

func (b *stormBurst) until(end time.Time) {
	b.mu.Lock()
	b.end = end
	b.mu.Unlock()
}

func (b *stormBurst) over() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.end.IsZero() && time.Now().After(b.end)
}

func (s *storm) startBurst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b := &stormBurst{cancel: cancel, relabelled: make(chan struct{}, 1)}
	s.ops = b
	for w := range 2 {
		rng := rand.New(rand.NewPCG(s.seed, uint64(s.kills+1)<<8|uint64(w+1)))
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for ctx.Err() == nil && !b.over() {
				s.operate(ctx, rng, b)
				time.Sleep(time.Duration(30+rng.IntN(220)) * time.Millisecond)
			}
		}()
	}
}

// stopBurst ends the burst, if one runs, once its workers are done.
func (s *storm) stopBurst() {
	b := s.ops
	if b == nil {
		return
	}
	for !b.over() {
		b.mu.Lock()
		if b.end.IsZero() {
			b.end = time.Now()
		}
		b.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	// Each worker finishes the operation it is in: one cut off would
	// count as failed.
	b.wg.Wait()
	b.cancel()
	s.ops = nil
}

// operate does one random operation: a pod created or deleted, a pod's or
// a namespace's mesh label changed, or the proxy hanging up.
func (s *storm) operate(ctx context.Context, rng *rand.Rand, b *stormBurst) {
	core := s.m.Client.CoreV1()
	list, err := core.Pods("").List(ctx, metav1.ListOptions{LabelSelector: stormRoleLabel + "=chaos"})
	if err != nil {
		s.count("list pods", err)
		return
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	kinds := []string{"namespace label", "namespace label", "pod label", "pod label", "pod label", "proxy reconnect"}
	if len(live) < stormMaxPods {
		kinds = append(kinds, "pod create", "pod create", "pod create")
	}
	if len(live) > stormMinPods {
		kinds = append(kinds, "pod delete", "pod delete")
	}
	kind := kinds[rng.IntN(len(kinds))]
	if len(live) == 0 && kind == "pod label" {
		kind = "namespace label"
	}
	var pick *corev1.Pod
	if len(live) > 0 {
		pick = &live[rng.IntN(len(live))]
	}
	switch kind {
	case "namespace label":
		name := stormChaosNamespaces[rng.IntN(len(stormChaosNamespaces))]
		ns, err := core.Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			value := meshEnabled
			if ns.Labels[meshLabel] == meshEnabled {
				value = ""
			}
			err = s.patchLabel(ctx, "", name, value)
		}
		s.count(kind, err)
		b.relabel(err)
	case "pod label":
		values := slices.DeleteFunc([]string{"", "none", meshEnabled}, func(v string) bool { return v == pick.Labels[meshLabel] })
		err := s.patchLabel(ctx, pick.Namespace, pick.Name, values[rng.IntN(len(values))])
		s.count(kind, err)
		b.relabel(err)
	case "pod create":
		ns := stormChaosNamespaces[rng.IntN(len(stormChaosNamespaces))]
		mode := []string{"", "", "", "none", meshEnabled}[rng.IntN(5)]
		_, err := core.Pods(ns).Create(ctx, s.newPod(ns, mode), metav1.CreateOptions{})
		s.count(kind, err)
	case "pod delete":
		err := core.Pods(pick.Namespace).Delete(ctx, pick.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pick.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			err = nil // the other worker was first
		}
		s.count(kind, err)
	case "proxy reconnect":
		s.proxy.flap(time.Duration(rng.Int64N(int64(800 * time.Millisecond))))
		s.count(kind, nil)
	}
}

// patchLabel sets the mesh label of a pod (ns, name) or, with ns "", of
// the namespace name; value "" removes it.
func (s *storm) patchLabel(ctx context.Context, ns, name, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, meshLabel, value)
	if value == "" {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, meshLabel)
	}
	var err error
	if ns == "" {
		_, err = s.m.Client.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	} else {
		_, err = s.m.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile by the other worker
	}
	return err
}

// report prints the storm's figures: kill points by the phase they hit,
// operations by kind, times to SERVING and to settled, and every
// violation.
func (s *storm) report(t *testing.T, kills int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "crash storm report (seed %d)\n", s.seed)
	fmt.Fprintf(&b, "kill points: %d (", kills)
	for i, phase := range []string{"startup", "burst", "burst, after a relabel", "at rest"} {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", phase, s.killPhases[phase])
	}
	fmt.Fprintf(&b, "); settled checks: %d\n", s.checks)
	b.WriteString("operations:")
	for _, kind := range slices.Sorted(maps.Keys(s.opCounts)) {
		c := s.opCounts[kind]
		fmt.Fprintf(&b, " %s %d", kind, c.done)
		if c.failed > 0 {
			fmt.Fprintf(&b, " (%d failed)", c.failed)
		}
		b.WriteString(";")
	}
	fmt.Fprintf(&b, "\nproxy connections: %d\n", s.proxy.connections())
	fmt.Fprintf(&b, "start to SERVING: p50 %s, max %s (%d starts)\n", percentile(s.servings, 50).Round(time.Millisecond), percentile(s.servings, 100).Round(time.Millisecond), len(s.servings))
	fmt.Fprintf(&b, "start to settled: p50 %s, max %s (%d settles)\n", percentile(s.settles, 50).Round(time.Millisecond), percentile(s.settles, 100).Round(time.Millisecond), len(s.settles))
	b.WriteString("the daemon's work after kills, from its log:")
	for _, w := range s.daemonWork(t) {
		fmt.Fprintf(&b, "\n  %s", w)
	}
	fmt.Fprintf(&b, "\nviolations: %d\n", len(s.violations))
	for _, v := range s.violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	t.Log(b.String())
}

// percentile is the p-th percentile of ds (nearest rank), 0 for none.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)]
}

// recoveryMessages are the daemon's log messages that show it finishing
// or undoing what a kill interrupted, or catching up with what happened
// while it was down.
var recoveryMessages = []string{
	"repairing",
	"record dropped",
	"capture taken back: the add failed after it",
	"pod moved to another namespace",
	"namespace left for teardown settled",
	"pod released: it is gone from the Kubernetes API",
	"pod released: the enrolment policy leaves it uncaptured",
	"running pod's namespace found and proven by its IPs",
	"running pod enrolled: it matches the policy",
}

// daemonWork counts, in the daemon's log over the whole storm, the
// recovery messages and every warning and error by message.
func (s *storm) daemonWork(t *testing.T) []string {
	f, err := os.Open(s.m.daemon.log)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		level, _ := l["@level"].(string)
		msg, _ := l["@message"].(string)
		switch {
		case level == "warn" || level == "error":
			// A call's own line says which call ended how.
			if method, ok := l["grpc.method"].(string); ok {
				msg = fmt.Sprintf("%s (%s %v)", msg, method, l["grpc.code"])
			}
			counts[level+": "+msg]++
		case slices.Contains(recoveryMessages, msg):
			counts[msg]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Errorf("read %s: %v", s.m.daemon.log, err)
	}
	var out []string
	for _, msg := range recoveryMessages {
		out = append(out, fmt.Sprintf("%q %d", msg, counts[msg]))
		delete(counts, msg)
	}
	for _, msg := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, fmt.Sprintf("%s (%d)", msg, counts[msg]))
	}
	return out
}
