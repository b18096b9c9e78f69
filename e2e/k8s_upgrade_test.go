package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// The second build the upgrade tests move to and back from: the tree
// buildImage builds, stamped as another release (hack/image.sh with
// NFTREDIR_BUILD_VERSION), so that every binary in it differs from the
// first build's, and tagged apart.
const (
	upgradeTag     = "nftredir:upgraded"
	upgradeVersion = "v0.0.0-upgraded"
)

var (
	upgradeOnce sync.Once
	upgradeErr  error
	upgradeOut  string
)

// buildUpgradeImage builds the second build's image once per test
// binary, for the node's platform only (the cluster runs no other), and
// returns its tarball.
func buildUpgradeImage(t *testing.T) string {
	t.Helper()
	bin := binaries(t)
	dir := filepath.Join(binDir, "image-upgraded")
	tarball := filepath.Join(dir, "nftredir-image.tar")
	upgradeOnce.Do(func() {
		start := time.Now()
		cmd := exec.Command(filepath.Join(bin.Repo, "hack", "image.sh"), tarball, upgradeTag, filepath.Join(dir, "bin"))
		cmd.Dir = bin.Repo
		cmd.Env = append(os.Environ(), "NFTREDIR_BUILD_VERSION="+upgradeVersion, "IMAGE_PLATFORMS=linux/"+runtime.GOARCH)
		b, err := cmd.CombinedOutput()
		if err != nil {
			upgradeErr = fmt.Errorf("hack/image.sh (%s): %v\n%s", upgradeVersion, err, b)
			return
		}
		upgradeOut = fmt.Sprintf("%s (%s)", bytes.TrimSpace(b), time.Since(start).Round(time.Millisecond))
	})
	if upgradeErr != nil {
		t.Fatal(upgradeErr)
	}
	t.Logf("%s", upgradeOut)
	return tarball
}

var buildInfoVersion = regexp.MustCompile(`(?m)^nftredir_build_info\{.*[{,]version="([^"]*)"`)

// daemonVersion is the version the node's daemon reports in build_info.
func daemonVersion(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	text := scrapeNode(t, c)
	m := buildInfoVersion.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no nftredir_build_info with a version in /metrics")
	}
	return m[1]
}

// firstDialPort is the local port of a started pod's first connection
// (standin app -first-dial): below every pod's ephemeral range, so the
// target app seeing it means the connection reached it straight from
// the pod, while a proxy's own connection comes from an ephemeral port.
const firstDialPort = 21000

// podEvery is how often a pod is started during a step.
const podEvery = 500 * time.Millisecond

// upgradeFlow is connections made without pause through a step, each of
// which must be ok (captured and answered as the mesh answers) and none
// bad (answered around the proxy).
type upgradeFlow struct {
	p       *prober
	ok, bad func(try) bool
}

// chartUpgrade drives `helm upgrade` and `helm rollback` of a chart
// install while pods keep being started in a mesh namespace and captured
// connections flow, and checks after each step what must have held
// throughout it.
type chartUpgrade struct {
	m     *meshCluster
	chart *chartInstall
	// template is the mesh pod started during the steps; its app's first
	// act is a connection to firstTarget, which must never be answered
	// straight from the pod, and through which firstThrough tells the
	// node proxy's answer.
	template     *corev1.Pod
	firstTarget  string
	firstThrough func(try) bool
	flows        []upgradeFlow
	// steady run through every step: none may restart. annotated are
	// those of them whose redirection annotation must stay enabled.
	steady    []*corev1.Pod
	annotated []*corev1.Pod
	annos     *annoWatch
	// started are the pods started by the steps so far.
	started []*corev1.Pod
	// viaNRI: new pods are enrolled by the daemon's NRI hook, not
	// nftredir-cni, whose log then has none of them.
	viaNRI bool
}

// newPod is the template named name, its app dialling first.
func (u *chartUpgrade) newPod(name string) *corev1.Pod {
	p := u.template.DeepCopy()
	p.Name = name
	p.Spec.Containers[0].Args = []string{"app", "-port", "8080", "-name", name,
		"-first-dial", u.firstTarget, "-first-dial-port", strconv.Itoa(firstDialPort)}
	return p
}

// podStarter creates a pod every podEvery, and one more at once when
// kicked, until stopped; it never waits for them.
type podStarter struct {
	kick chan struct{}
	stop func()
	mu   sync.Mutex
	// protects the following fields
	pods []startedPod
	errs []error
}

type startedPod struct {
	name   string
	kicked bool
}

func (u *chartUpgrade) startPods(prefix string) *podStarter {
	s := &podStarter{kick: make(chan struct{}, 1)}
	quit, done := make(chan struct{}), make(chan struct{})
	c := u.m.Cluster
	go func() {
		defer close(done)
		tick := time.NewTicker(podEvery)
		defer tick.Stop()
		for n := 0; ; n++ {
			kicked := false
			if n > 0 {
				select {
				case <-quit:
					return
				case <-tick.C:
				case <-s.kick:
					kicked = true
				}
			}
			p := u.newPod(fmt.Sprintf("%s-%d", prefix, n))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			cancel()
			s.mu.Lock()
			if err != nil {
				s.errs = append(s.errs, fmt.Errorf("create pod %s: %w", p.Name, err))
			} else {
				s.pods = append(s.pods, startedPod{name: p.Name, kicked: kicked})
			}
			s.mu.Unlock()
		}
	}()
	var once sync.Once
	s.stop = func() { once.Do(func() { close(quit); <-done }) }
	return s
}

// rollout follows the DaemonSet's pods from a step's start, every 50 ms:
// when the old pod began to stop, when it was gone, when its replacement
// appeared and when that was Ready. onStopping runs once, as the old pod
// begins to stop.
type rollout struct {
	start      time.Time
	stop       func()
	mu         sync.Mutex
	stopping   time.Duration
	gone       time.Duration
	newSeen    time.Duration
	newReady   time.Duration
	newName    string
	pollErrors int
}

func watchRollout(c *kcluster.Cluster, old string, start time.Time, onStopping func()) *rollout {
	r := &rollout{start: start}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			l, err := c.Client.CoreV1().Pods(dsNamespace).List(ctx, metav1.ListOptions{LabelSelector: dsSelector})
			cancel()
			at := time.Since(start)
			r.mu.Lock()
			if err != nil {
				r.pollErrors++
			} else {
				oldThere := false
				for _, p := range l.Items {
					if p.Name == old {
						oldThere = true
						if p.DeletionTimestamp != nil && r.stopping == 0 {
							r.stopping = at
							go onStopping()
						}
						continue
					}
					if r.newSeen == 0 {
						r.newSeen, r.newName = at, p.Name
					}
					if p.Name == r.newName && r.newReady == 0 && kcluster.PodReady(&p) {
						r.newReady = at
					}
				}
				if !oldThere && r.gone == 0 {
					r.gone = at
					if r.stopping == 0 {
						r.stopping = at
						go onStopping()
					}
				}
			}
			r.mu.Unlock()
			select {
			case <-quit:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	r.stop = func() { once.Do(func() { close(quit); <-done }) }
	return r
}

func (r *rollout) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ms := func(d time.Duration) string { return "+" + d.Round(10*time.Millisecond).String() }
	s := fmt.Sprintf("old pod stopping at %s and gone at %s, new pod %s seen at %s and Ready at %s", ms(r.stopping), ms(r.gone), r.newName, ms(r.newSeen), ms(r.newReady))
	if r.pollErrors > 0 {
		// The times above are then late by up to a poll each.
		s += fmt.Sprintf(" (%d polls of the API failed)", r.pollErrors)
	}
	return s
}

// enrolledLine is the plugin's log line of a pod its ADD enrolled (hclog's
// text format), with how long its AddPod call took, the retries while
// the daemon did not answer included.
var enrolledLine = regexp.MustCompile(`(?m)^(\S+) \[INFO\]\s+nftredir-cni: pod enrolled: .* k8s_name=(\S+) .*call_ms=([0-9.]+)`)

// cniAdd is a pod's enrolment by the plugin: when it was logged and how
// long its AddPod call took. A call that met the node without a serving
// daemon lasts as long as the plugin waited for the new one.
type cniAdd struct {
	at     time.Time
	callMS float64
}

// cniAdds reads the plugin's log at path.
func cniAdds(t *testing.T, path string) map[string]cniAdd {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the plugin's log: %v", err)
	}
	adds := map[string]cniAdd{}
	for _, m := range enrolledLine.FindAllStringSubmatch(string(b), -1) {
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", m[1])
		ms, err2 := strconv.ParseFloat(m[3], 64)
		if err == nil && err2 == nil {
			adds[m[2]] = cniAdd{at: at, callMS: ms}
		}
	}
	return adds
}

// summarizeAdds sums up the AddPod calls of the pods' ADDs.
func summarizeAdds(t *testing.T, adds map[string]cniAdd, pods []*corev1.Pod) string {
	t.Helper()
	var calls []float64
	waited := 0
	for _, p := range pods {
		a, ok := adds[p.Name]
		if !ok {
			t.Errorf("the plugin's log has no enrolment of pod %s", p.Name)
			continue
		}
		calls = append(calls, a.callMS)
		if a.callMS >= 100 {
			waited++
		}
	}
	if len(calls) == 0 {
		return "none logged"
	}
	slices.Sort(calls)
	return fmt.Sprintf("min / median / max %.1f / %.1f / %.1f ms, %d of %d over 100 ms", calls[0], calls[len(calls)/2], calls[len(calls)-1], waited, len(calls))
}

// proxyConnectedAt is when the daemon of the DaemonSet pod first logged a
// node proxy connecting over ZDS, or the zero time.
func proxyConnectedAt(t *testing.T, c *kcluster.Cluster, pod string) time.Time {
	t.Helper()
	for line := range strings.SplitSeq(c.PodLogs(t, dsNamespace, pod, "nftredird"), "\n") {
		var m struct {
			Message string `json:"@message"`
			At      string `json:"@timestamp"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Message == "node proxy connected" {
			if at, err := time.Parse(time.RFC3339Nano, m.At); err == nil {
				return at
			}
		}
	}
	return time.Time{}
}

// firstConnection is what standin app -first-dial printed.
type firstConnection struct {
	Local  string `json:"local"`
	To     string `json:"to"`
	Answer string `json:"answer"`
	Error  string `json:"error"`
}

// firstConnectionOf reads a started pod's first connection from its log.
func firstConnectionOf(t *testing.T, c *kcluster.Cluster, p *corev1.Pod) (firstConnection, try) {
	t.Helper()
	var line struct {
		First *firstConnection `json:"firstConnection"`
	}
	var raw string
	deadline := time.Now().Add(15 * time.Second)
	for {
		raw = c.PodLogs(t, p.Namespace, p.Name, "main")
		first, _, _ := strings.Cut(raw, "\n")
		if json.Unmarshal([]byte(first), &line) == nil && line.First != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s logged no first connection in 15s: %q", p.Namespace, p.Name, raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fc := *line.First
	r := try{answer: fc.Answer}
	r.local, _ = netip.ParseAddrPort(fc.Local)
	if fc.Error != "" {
		r.err = errors.New(fc.Error)
	}
	return fc, r
}

// firstOutcome sorts a started pod's first connection.
type firstOutcome int

const (
	// firstThrough: answered through the node proxy.
	firstThrough firstOutcome = iota
	// firstRefused: refused inside the pod, by the capture's redirect to
	// a proxy port nothing listened on yet (the proxy had not been handed
	// the pod), which zdsRequireAck rules out. Captured: an uncaptured
	// connection reaches the target,
	// which answers every connection (the flows show it reachable), and
	// only a local port with no listener refuses.
	firstRefused
	// firstDirect: the target saw the pod's own address and port: the
	// app's first connection went out uncaptured.
	firstDirect
	// firstFailed: anything else.
	firstFailed
)

func (u *chartUpgrade) classify(r try) firstOutcome {
	switch {
	case r.direct():
		return firstDirect
	case r.err == nil && u.firstThrough(r):
		return firstThrough
	case r.err != nil && strings.Contains(r.err.Error(), "connection refused"):
		return firstRefused
	}
	return firstFailed
}

// step runs one helm command (helm upgrade or helm rollback, with
// --wait) that replaces the DaemonSet's pod with one of image, whose
// daemon must then report version. Pods keep being started in the mesh
// namespace from a second before the command until 3 s after the new
// pod is Ready, and the flows keep dialling. Then it checks: every try of
// every flow was answered as captured, none around the proxy; every
// started pod was captured from its app's first connection, and is
// Ready, enrolled, in sync and annotated, in its first sandbox; no pod
// running before the step restarted; the DaemonSet's pod was replaced by
// a Ready one of the new build. The figures go to the test log.
func (u *chartUpgrade) step(t *testing.T, prefix string, helmArgs []string, image, version string) {
	c := u.m.Cluster
	before := map[string]podRuntime{}
	existing := append(slices.Clone(u.steady), u.started...)
	for _, p := range existing {
		before[p.Name] = runtimeOf(t, c, p)
	}
	old := u.chart.Pod
	oldVersion := daemonVersion(t, c)
	if oldVersion == version {
		t.Fatalf("the daemon already reports version %q: the step would not change the build", version)
	}

	start := time.Now()
	starter := u.startPods(prefix)
	defer starter.stop()
	ro := watchRollout(c, old.Name, start, func() {
		// One pod more as the old daemon stops: its sandbox meets the
		// node with no daemon serving, or the old one's last moments.
		select {
		case starter.kick <- struct{}{}:
		default:
		}
	})
	defer ro.stop()
	time.Sleep(time.Second)
	helmStart := time.Now()
	out := helm(t, c, helmArgs...)
	helmTook := time.Since(helmStart)
	u.chart.Pod = waitDSPodReady(t, c, old.Name)
	waitUntil(t, "the old DaemonSet pod "+old.Name+" to be gone", kcluster.DefaultTimeout, func() bool {
		return !slices.ContainsFunc(dsAllPods(t, c), func(p corev1.Pod) bool { return p.Name == old.Name })
	})
	replaced := time.Now()
	time.Sleep(3 * time.Second)
	starter.stop()
	ro.stop()
	end := time.Now()
	t.Logf("helm %s: %s", helmArgs[0], strings.TrimSpace(out))
	t.Logf("helm %s returned %s after it began; %s (relative to the pods' start, helm began at +%s); DaemonSet pod replaced and Ready %s after helm began",
		helmArgs[0], helmTook.Round(time.Millisecond), ro, helmStart.Sub(start).Round(10*time.Millisecond), replaced.Sub(helmStart).Round(time.Millisecond))

	t.Run("DaemonSet pod replaced by a Ready one of the new build", func(t *testing.T) {
		p := u.chart.Pod
		pods := dsAllPods(t, c)
		if len(pods) != 1 || pods[0].Name != p.Name {
			var names []string
			for _, q := range pods {
				names = append(names, q.Name)
			}
			t.Errorf("DaemonSet pods %v; want %s alone", names, p.Name)
		}
		var ids []string
		for _, ctr := range p.Spec.Containers {
			if ctr.Image != image {
				t.Errorf("container %s runs %s; want %s", ctr.Name, ctr.Image, image)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready || cs.RestartCount != 0 {
				t.Errorf("container %s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			}
			ids = append(ids, cs.Name+" "+cs.ImageID)
		}
		ds, err := c.Client.AppsV1().DaemonSets(dsNamespace).Get(t.Context(), dsRelease, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := ds.Status
		if st.DesiredNumberScheduled != 1 || st.UpdatedNumberScheduled != 1 || st.NumberReady != 1 || st.NumberAvailable != 1 {
			t.Errorf("DaemonSet status %+v; want 1 desired, updated, ready and available", st)
		}
		got := daemonVersion(t, c)
		if got != version {
			t.Errorf("the daemon reports version %q; want %q", got, version)
		}
		t.Logf("%s replaced %s: images %v; build_info version %q, was %q", p.Name, old.Name, ids, got, oldVersion)
	})

	t.Run("every captured connection answered through the proxy", func(t *testing.T) {
		for _, f := range u.flows {
			ph := summarize(f.p.tries(start, end), f.ok, f.bad)
			t.Logf("%s over the step (%s): %s", f.p.name, end.Sub(start).Round(time.Millisecond), ph)
			if ph.tries < 10 {
				t.Errorf("%s: only %d tries over the step", f.p.name, ph.tries)
			}
			if ph.failed > 0 {
				t.Errorf("%s: %d tries not answered as captured (at most %d in a row, %s)", f.p.name, ph.failed, ph.run, ph.runSpan)
			}
			for _, r := range ph.bad {
				t.Errorf("%s: answered around the proxy: %v", f.p.name, r)
			}
		}
	})

	starter.mu.Lock()
	started, createErrs := slices.Clone(starter.pods), starter.errs
	starter.mu.Unlock()
	if len(createErrs) > 0 {
		t.Errorf("creating pods during the step: %v", createErrs)
	}
	var newPods []*corev1.Pod
	t.Run("every started pod captured from its first connection", func(t *testing.T) {
		var counts [4]int
		var refusedSandboxes, refusalEvents, kicked int
		for _, sp := range started {
			newPods = append(newPods, c.WaitPodReady(t, u.template.Namespace, sp.name))
			if sp.kicked {
				kicked++
			}
		}
		// Read once every ADD is done: each logs before it returns.
		adds := map[string]cniAdd{}
		if !u.viaNRI {
			adds = cniAdds(t, u.m.cniLog)
		}
		var refusedAt []string
		var heldByValidator int
		for _, p := range newPods {
			fc, r := firstConnectionOf(t, c, p)
			o := u.classify(r)
			counts[o]++
			switch o {
			case firstRefused:
				// The chart's zdsRequireAck holds a sandbox until the
				// proxy has the pod: none may start before.
				at := p.Name
				if a, ok := adds[p.Name]; ok {
					at = fmt.Sprintf("%s enrolled at +%s", p.Name, a.at.Sub(start).Round(10*time.Millisecond))
				}
				refusedAt = append(refusedAt, at)
				t.Errorf("pod %s started before the node proxy had it: its app's first connection to %s was refused by the capture", p.Name, fc.To)
			case firstDirect:
				t.Errorf("pod %s started uncaptured: its app's first connection to %s reached %q", p.Name, fc.To, fc.Answer)
			case firstFailed:
				t.Errorf("pod %s: its app's first connection to %s failed, neither answered through the proxy nor refused by the capture: %+v", p.Name, fc.To, fc)
			}
			rec := u.m.enrolled(t, p.UID)
			if rec == nil {
				t.Errorf("pod %s Ready but not enrolled", p.Name)
			}
			u.m.waitAnnotation(t, p, redirectionEnabled)
			rt := runtimeOf(t, c, p)
			if rt.restarts != 0 || len(rt.sandboxes) != 1 {
				t.Errorf("pod %s: %s; want no restart, one sandbox", p.Name, rt)
			}
			n, held := 0, false
			for _, e := range c.PodEvents(t, p.Namespace, p.Name) {
				switch {
				case e.Reason == "FailedCreatePodSandBox":
					n += int(max(e.Count, 1))
				case strings.Contains(e.Message, validatorRefusal):
					held = true
				}
			}
			if held {
				heldByValidator++
			}
			if u.viaNRI {
				wantNoCNIAdd(t, u.m.cniLog, p)
			}
			if n > 0 {
				refusedSandboxes++
				refusalEvents += n
			}
		}
		t.Logf("pods started during the step: %d (one every %s, and %d more as the old pod began to stop); their apps' first connection to %s: %d through the proxy, %d refused by the capture before the proxy had the pod, %d uncaptured, %d failed otherwise",
			len(started), podEvery, kicked, u.firstTarget, counts[firstThrough], counts[firstRefused], counts[firstDirect], counts[firstFailed])
		if u.viaNRI {
			t.Logf("enrolled through NRI, none through nftredir-cni; %d pods had their containers held by the runtime's validator while no daemon was registered, %d a sandbox refused first (%d FailedCreatePodSandBox events: the hook failing closed)",
				heldByValidator, refusedSandboxes, refusalEvents)
		} else {
			t.Logf("their CNI ADDs' AddPod calls, the plugin's retries included: %s; %d pods had a sandbox refused first (%d FailedCreatePodSandBox events: the plugin failing closed while no daemon answered)",
				summarizeAdds(t, adds, newPods), refusedSandboxes, refusalEvents)
		}
		if len(refusedAt) > 0 {
			connected := "never"
			if at := proxyConnectedAt(t, c, u.chart.Pod.Name); !at.IsZero() {
				connected = "+" + at.Sub(start).Round(10*time.Millisecond).String()
			}
			t.Logf("first connections refused by the capture: %s; the node proxy connected to the new daemon at %s", strings.Join(refusedAt, ", "), connected)
		}
		if len(started) < 5 {
			t.Errorf("only %d pods started during the step", len(started))
		}
	})

	t.Run("no pod restarted", func(t *testing.T) {
		for _, p := range existing {
			now := runtimeOf(t, c, p)
			if !now.equal(before[p.Name]) {
				t.Errorf("pod %s: before the step %s, after %s", p.Name, before[p.Name], now)
			}
		}
		t.Logf("%d pods running before the step: restart counts and sandboxes unchanged", len(existing))
	})

	t.Run("the redirection annotation never flipped", func(t *testing.T) {
		for _, p := range u.annotated {
			for _, v := range u.annos.values(p.Name) {
				if v != redirectionEnabled {
					t.Errorf("pod %s's redirection annotation was %q at some point; want %q throughout", p.Name, v, redirectionEnabled)
				}
			}
			u.m.enrolled(t, p.UID)
		}
	})
	u.started = append(u.started, newPods...)
}

// upgradeAndRollBack imports the second build's image and runs the two
// steps: `helm upgrade` of the release to it (the chart and the install's
// values, the image tag set), then `helm rollback` to revision 1.
func (u *chartUpgrade) upgradeAndRollBack(t *testing.T) {
	t.Helper()
	c := u.m.Cluster
	c.ImportImage(t, buildUpgradeImage(t))
	chart := filepath.Join(binaries(t).Repo, "charts", "nftredir")
	first := daemonVersion(t, c)
	upgrade := []string{"upgrade", dsRelease, chart, "--namespace", dsNamespace, "--wait", "--timeout", "2m"}
	for _, v := range u.chart.Values {
		upgrade = append(upgrade, "-f", v)
	}
	upgrade = append(upgrade, "--set", "image.tag="+strings.TrimPrefix(upgradeTag, "nftredir:"))
	if !t.Run("helm upgrade to another build", func(t *testing.T) {
		u.step(t, "upgrade", upgrade, upgradeTag, upgradeVersion)
	}) {
		return
	}
	t.Run("helm rollback to the first revision", func(t *testing.T) {
		u.step(t, "rollback", []string{"rollback", dsRelease, "1", "--namespace", dsNamespace, "--wait", "--timeout", "2m"}, imageTag, first)
	})
	t.Logf("helm history:\n%s", helm(t, c, "history", dsRelease, "--namespace", dsNamespace))
}

// TestK8sUpgrade upgrades nftredir, installed from its chart as users
// install it, to a different build with `helm upgrade`, and goes back
// with `helm rollback`, each while mesh pods keep being started and
// captured connections flow: inbound to a mesh pod from a pod outside
// the mesh, and outbound from a mesh pod, every 50 ms, through a node
// proxy that follows the daemon over ZDS as ztunnel does (zdsStandin).
// The Istio suite does the same with stock ztunnel and istiod
// (TestIstioAmbientMesh).
func TestK8sUpgrade(t *testing.T) {
	begin := time.Now()
	// Both builds before the cluster starts: they take a while, alone.
	buildImage(t)
	buildUpgradeImage(t)
	c := startCluster(t)
	h := newDSHost(t, c)
	ci := installChart(t, c, h, withProxy(nil))
	t.Logf("nftredir DaemonSet pod %s Ready %s after helm install", ci.Pod.Name, ci.Took.Round(time.Millisecond))
	m := &meshCluster{Cluster: c, api: ci.API, cniLog: h.cniLog}
	proxy := startZDSStandin(t, h.zdsSocket())

	const ns = "mesh"
	c.CreateNamespace(t, ns, map[string]string{meshLabel: meshEnabled})
	c.CreateNamespace(t, "outside", nil)
	outsider := m.runPod(t, "outside", "outsider")
	server := m.runPod(t, ns, "server")
	client := m.runPod(t, ns, "client")
	for _, p := range []*corev1.Pod{server, client} {
		m.waitEnrolled(t, p.UID, true)
		proxy.waitServes(t, string(p.UID))
		m.waitAnnotation(t, p, redirectionEnabled)
	}
	outsiderNS, clientNS := pinOf(t, outsider), pinOf(t, client)
	for _, pin := range []*nstest.Netns{outsiderNS, clientNS} {
		checkBelowEphemeral(t, pin)
	}
	serverAddr := netip.AddrPortFrom(podIP(server), 8080).String()
	outsiderAddr := netip.AddrPortFrom(podIP(outsider), 8080).String()
	const every = 50 * time.Millisecond
	inbound := startProber(t, "outsider -> server (inbound to a mesh pod)", outsiderNS, podIP(outsider), serverAddr, every)
	outbound := startProber(t, "client -> outsider (outbound from a mesh pod)", clientNS, podIP(client), outsiderAddr, every)
	answeredBy := func(listener string) func(try) bool {
		return func(r try) bool { return r.err == nil && r.answer == listener }
	}
	u := &chartUpgrade{
		m: m, chart: ci,
		template:    c.StandinPod(t, ns, "template", 0, c.NodeName, "app"),
		firstTarget: outsiderAddr,
		// The stand-in proxy answers with its listener's name.
		firstThrough: answeredBy(nstest.ProxyOutbound),
		flows: []upgradeFlow{
			{inbound, answeredBy(nstest.ProxyInbound), func(r try) bool { return r.answeredBy("server") }},
			{outbound, answeredBy(nstest.ProxyOutbound), func(r try) bool { return r.answeredBy("outsider") }},
		},
		steady:    []*corev1.Pod{server, client, outsider},
		annotated: []*corev1.Pod{server, client},
		annos:     watchRedirection(t, c, []*corev1.Pod{server, client}),
	}
	for _, f := range u.flows {
		f.p.waitRun(t, time.Now(), 5, 15*time.Second, f.ok)
	}
	t.Logf("steady: %s and %s answered by the stand-in proxy (%s) %s after the test began", inbound.name, outbound.name, proxy, time.Since(begin).Round(time.Millisecond))

	u.upgradeAndRollBack(t)
	inbound.stop()
	outbound.stop()
	if problems := proxy.problemList(); len(problems) > 0 {
		t.Errorf("the ZDS stand-in proxy nacked: %q", problems)
	}
	t.Logf("the ZDS stand-in proxy: %s", proxy)
	t.Logf("TestK8sUpgrade took %s", time.Since(begin).Round(time.Millisecond))
}
