package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/client"
)

// CNI ADD as the runtime sees it: libcni (the library podman, containerd
// and kubelet's runtimes use) runs bridge + host-local, with and without
// nftredir-cni appended, in namespaces this program made. The bridge
// lives in the benchmark's node namespace, never in the machine's own.

// Method names of the CNI section.
const (
	cniWithout    = "bridge + host-local"
	cniWith       = "bridge + host-local + nftredir-cni"
	cniExecOnly   = "bridge + host-local + nftredir-cni, namespace excluded"
	cniPluginAdd  = "nftredir-cni ADD (its exec inside the chain)"
	cniPluginDel  = "nftredir-cni DEL (its exec inside the chain)"
	cniVersionRun = "nftredir-cni VERSION (bare exec)"
	cniAddPod     = "AddPod over a warm connection"
	// cniRemovePod is the RemovePod a CNI DEL sends: with netns_path
	// and namespace_teardown.
	cniRemovePod = "RemovePod over a warm connection"
)

// bridgeIn names bridge's own exec (host-local's included) in a chain.
func bridgeIn(chain, cmd string) string { return "bridge " + cmd + " in " + chain }

func cniKey(chain, cmd string) string { return chain + ", " + cmd }

// timedExec is libcni's exec with each plugin's run timed, so the chain's
// time can be split into its plugins.
type timedExec struct {
	*invoke.DefaultExec
	mu sync.Mutex
	// last is the duration of the last exec of each plugin binary.
	last map[string]time.Duration
}

func newTimedExec() *timedExec {
	return &timedExec{
		DefaultExec: &invoke.DefaultExec{RawExec: &invoke.RawExec{}, PluginDecoder: version.PluginDecoder{}},
		last:        map[string]time.Duration{},
	}
}

func (e *timedExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	t0 := time.Now()
	out, err := e.RawExec.ExecPlugin(ctx, path, stdin, env)
	d := time.Since(t0)
	e.mu.Lock()
	e.last[filepath.Base(path)] = d
	e.mu.Unlock()
	return out, err
}

func (e *timedExec) took(plugin string) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last[plugin]
}

// cniSetup is what the CNI section needs besides the daemon.
type cniSetup struct {
	binDir string
	// disk, on diskRoot, holds what a node keeps on its root filesystem:
	// libcni's cache (/var/lib/cni), host-local's leases and
	// nftredir-cni's records (/var/lib/cni/nftredir), so their writes
	// cost what they cost on a node rather than tmpfs's nothing.
	disk    string
	cni     *libcni.CNIConfig
	exec    *timedExec
	without *libcni.NetworkConfigList
	with    *libcni.NetworkConfigList
	// execOnly has nftredir-cni exclude the pods' Kubernetes namespace,
	// so it runs and passes the result through without calling the
	// daemon: the floor of any chained plugin that is a process.
	execOnly *libcni.NetworkConfigList
}

// findCNIPlugins checks that the reference plugins hack/deps.sh builds and
// nftredir-cni are in dir, by default next to this program (make build
// and hack/deps.sh put them all in bin/).
func findCNIPlugins(dir string) (string, error) {
	if dir == "" {
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		dir = filepath.Dir(self)
	}
	var missing []string
	for _, p := range []string{"bridge", "host-local", "nftredir-cni"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("CNI plugins %s not found in %s; run hack/deps.sh and make build (make bench does both)", strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

func (b *bench) newCNISetup(d *daemon) (*cniSetup, error) {
	binDir, err := findCNIPlugins(b.cfg.cniBin)
	if err != nil {
		return nil, err
	}
	disk, err := os.MkdirTemp(diskRoot, fmt.Sprintf("%s%d-", namePrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	s := &cniSetup{binDir: binDir, disk: disk, exec: newTimedExec()}
	s.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(disk, "cache"), s.exec)
	// One bridge and one subnet; the networks lease from thirds of it.
	bridge := fmt.Sprintf("nftrb%d", os.Getpid()%100000)
	mk := func(name, start, end string, more ...any) (*libcni.NetworkConfigList, error) {
		plugins := append([]any{map[string]any{
			"type": "bridge", "bridge": bridge, "isGateway": true,
			// No masquerade: bridge would program iptables in the node
			// namespace, which neither chain needs.
			"ipMasq": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": filepath.Join(disk, "ipam"),
				"ranges": [][]map[string]string{{{
					"subnet": "10.251.0.0/16", "rangeStart": start, "rangeEnd": end, "gateway": "10.251.0.1",
				}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}}, more...)
		raw, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": plugins})
		if err != nil {
			return nil, err
		}
		return libcni.NetworkConfFromBytes(raw)
	}
	plugin := func(extra ...string) map[string]any {
		m := map[string]any{"type": "nftredir-cni", "socket": d.socket, "dataDir": filepath.Join(disk, "nftredir")}
		if len(extra) > 0 {
			m["excludeNamespaces"] = extra
		}
		return m
	}
	if s.without, err = mk(fmt.Sprintf("nftr-bench-%d-plain", os.Getpid()), "10.251.0.10", "10.251.84.250"); err == nil {
		if s.with, err = mk(fmt.Sprintf("nftr-bench-%d-nftredir", os.Getpid()), "10.251.85.10", "10.251.169.250", plugin()); err == nil {
			s.execOnly, err = mk(fmt.Sprintf("nftr-bench-%d-excluded", os.Getpid()), "10.251.170.10", "10.251.254.250", plugin(cniPodNamespace))
		}
	}
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(disk))
	}
	return s, nil
}

// cniPodNamespace is the Kubernetes namespace the runtime names for every
// pod (K8S_POD_NAMESPACE).
const cniPodNamespace = "bench"

// inNode runs f on a thread that entered the node namespace, so the
// plugins libcni starts (children of that thread) create the bridge and
// the host ends of the veths there. The thread returns to this process's
// namespace afterwards and is handed back to the runtime: a thread that
// ended instead would fire the Pdeathsig of the daemon, should the
// daemon have been started from it.
func (b *bench) inNode(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own namespace: %w", err)
			return
		}
		defer unix.Close(home)
		node, err := unix.Open(b.nodeNetns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open node namespace: %w", err)
			return
		}
		err = unix.Setns(node, unix.CLONE_NEWNET)
		unix.Close(node)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter node namespace: %w", err)
			return
		}
		ferr := f()
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread, in the wrong namespace, ends
			// with this goroutine rather than serve other work.
			errc <- errors.Join(ferr, fmt.Errorf("return from node namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// cniSample runs one repetition of the CNI section: for each of
// cfg.cniPods pairs, one pod through each chain (ADD, then DEL; which
// chain goes first alternates), one bare VERSION exec of the plugin and
// one AddPod and RemovePod straight to the daemon, each on a fresh
// namespace. Each namespace is deleted right after its DEL or RemovePod,
// untimed, as runtimes delete a pod's namespace right after CNI DEL: the
// daemon may leave the pod's capture to that deletion, and the kernel's
// work of it then falls where it falls on a node, for every chain alike.
func (b *bench) cniSample(ctx context.Context, d *daemon, s *cniSetup, rep int) (map[string]*sample, error) {
	n := b.cfg.cniPods
	out := map[string]*sample{}
	var methods []string
	for _, chain := range []string{cniWithout, cniWith, cniExecOnly} {
		methods = append(methods, cniKey(chain, "ADD"), cniKey(chain, "DEL"), cniKey(chain, "ADD+DEL"), bridgeIn(chain, "ADD"), bridgeIn(chain, "DEL"))
	}
	for _, m := range append(methods, cniPluginAdd, cniPluginDel, cniVersionRun, cniAddPod, cniRemovePod) {
		out[m] = &sample{method: m, rep: rep, conc: 1, load: loadAvg()}
	}
	add := func(m string, dur time.Duration) { out[m].lat = append(out[m].lat, dur) }
	names, err := b.pool.create(4*n, "c")
	if err != nil {
		return nil, err
	}
	// Those not dropped after their DEL, because a step failed, go here.
	defer b.pool.remove(names)
	t0 := time.Now()
	err = b.inNode(func() error {
		chain := func(list *libcni.NetworkConfigList, label, ns string) error {
			rt := &libcni.RuntimeConf{
				ContainerID: fmt.Sprintf("bench-%d-%s", rep, ns[len(b.pool.prefix):]),
				NetNS:       nsPath(ns),
				IfName:      "eth0",
				Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", cniPodNamespace},
					{"K8S_POD_NAME", ns}, {"K8S_POD_UID", "cni-" + ns[len(b.pool.prefix):]}},
			}
			start := time.Now()
			if _, err := s.cni.AddNetworkList(ctx, list, rt); err != nil {
				return fmt.Errorf("%s ADD %s: %w", label, ns, err)
			}
			addT := time.Since(start)
			pluginAdd, bridgeAdd := s.exec.took("nftredir-cni"), s.exec.took("bridge")
			start = time.Now()
			if err := s.cni.DelNetworkList(ctx, list, rt); err != nil {
				return fmt.Errorf("%s DEL %s: %w", label, ns, err)
			}
			delT := time.Since(start)
			if err := b.pool.drop(ns); err != nil {
				return err
			}
			b.sleep(ctx, b.cfg.cniSettle)
			add(cniKey(label, "ADD"), addT)
			add(cniKey(label, "DEL"), delT)
			add(cniKey(label, "ADD+DEL"), addT+delT)
			add(bridgeIn(label, "ADD"), bridgeAdd)
			add(bridgeIn(label, "DEL"), s.exec.took("bridge"))
			if label == cniWith {
				add(cniPluginAdd, pluginAdd)
				add(cniPluginDel, s.exec.took("nftredir-cni"))
			}
			return nil
		}
		for i := range n {
			plain, captured, excluded, direct := names[4*i], names[4*i+1], names[4*i+2], names[4*i+3]
			runs := []func() error{
				func() error { return chain(s.without, cniWithout, plain) },
				func() error { return chain(s.with, cniWith, captured) },
				func() error { return chain(s.execOnly, cniExecOnly, excluded) },
			}
			// Each chain goes first, second and third in turn.
			for k := range runs {
				if err := runs[(k+i+rep)%len(runs)](); err != nil {
					return err
				}
			}
			start := time.Now()
			if _, err := s.exec.RawExec.ExecPlugin(ctx, filepath.Join(s.binDir, "nftredir-cni"), nil,
				[]string{"CNI_COMMAND=VERSION"}); err != nil {
				return fmt.Errorf("nftredir-cni VERSION: %w", err)
			}
			add(cniVersionRun, time.Since(start))
			uid := fmt.Sprintf("cni-direct-%d-%s", rep, direct[len(b.pool.prefix):])
			start = time.Now()
			if _, err := d.client.AddPod(ctx, addRequest(uid, direct, podIP(direct))); err != nil {
				return fmt.Errorf("AddPod %s: %w", direct, err)
			}
			add(cniAddPod, time.Since(start))
			// The release the plugin's DEL sends, then what the
			// runtime does next.
			start = time.Now()
			if _, err := d.client.RemovePod(ctx, uid, client.IfNetns(nsPath(direct)), client.NamespaceTeardown()); err != nil {
				return fmt.Errorf("RemovePod %s: %w", direct, err)
			}
			add(cniRemovePod, time.Since(start))
			if err := b.pool.drop(direct); err != nil {
				return err
			}
			b.sleep(ctx, b.cfg.cniSettle)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	wall := time.Since(t0)
	for _, smp := range out {
		smp.wall = wall
	}
	// A chain's DEL must leave nothing behind: no pod enrolled, no
	// attachment record.
	pods, err := d.client.ListPods(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if strings.HasPrefix(p.GetPodUid(), "cni-") {
			return nil, fmt.Errorf("pod %s still enrolled after the chain's DEL", p.GetPodUid())
		}
	}
	if left, _ := filepath.Glob(filepath.Join(s.disk, "nftredir", "*", "*:*")); len(left) > 0 {
		return nil, fmt.Errorf("nftredir-cni left %d attachment records after DEL: %v", len(left), left)
	}
	return out, nil
}

// cniPhase runs the CNI section cfg.reps times, settling between
// repetitions like the other phases.
func (b *bench) cniPhase(ctx context.Context, d *daemon, res *results) error {
	s, err := b.newCNISetup(d)
	if err != nil {
		return err
	}
	defer os.RemoveAll(s.disk)
	for rep := range b.cfg.reps {
		b.progress("CNI chains, repetition %d/%d: %d pods per chain through libcni", rep+1, b.cfg.reps, b.cfg.cniPods)
		smp, err := b.cniSample(ctx, d, s, rep)
		if err != nil {
			select {
			case <-d.exited:
				return fmt.Errorf("%w\nnftredird exited: %v\n%s", err, d.waitErr, d.logTail())
			default:
				return err
			}
		}
		for m, x := range smp {
			res.cni[m] = append(res.cni[m], x)
		}
		ratio := smp[cniKey(cniWith, "ADD+DEL")].p50() / smp[cniKey(cniWithout, "ADD+DEL")].p50()
		b.progress("  chain ADD+DEL p50 %.2f ms with nftredir-cni, %.2f ms without (%.3f×); nftredir-cni ADD %.2f ms, VERSION %.2f ms, AddPod %.2f ms (load %.2f)",
			smp[cniKey(cniWith, "ADD+DEL")].p50(), smp[cniKey(cniWithout, "ADD+DEL")].p50(), ratio,
			smp[cniPluginAdd].p50(), smp[cniVersionRun].p50(), smp[cniAddPod].p50(), smp[cniAddPod].load)
		b.sleep(ctx, b.cfg.settle)
	}
	return nil
}

func (r *report) cniTable() table {
	t := table{
		title: fmt.Sprintf("CNI ADD as the runtime sees it: libcni runs each chain on %d fresh namespaces per repetition, %d repetitions, median [min–max] over repetitions", r.cfg.cniPods, r.cfg.reps),
		head:  []string{"what", "vs the chain without nftredir-cni (p50)", "p50 ms", "p99 ms"},
	}
	c := r.res.cni
	var ms []string
	for _, cmd := range []string{"ADD", "DEL", "ADD+DEL"} {
		for _, chain := range []string{cniWithout, cniWith, cniExecOnly} {
			ms = append(ms, cniKey(chain, cmd))
		}
	}
	for _, cmd := range []string{"ADD", "DEL"} {
		for _, chain := range []string{cniWithout, cniWith, cniExecOnly} {
			ms = append(ms, bridgeIn(chain, cmd))
		}
	}
	ms = append(ms, cniPluginAdd, cniPluginDel, cniVersionRun, cniAddPod, cniRemovePod)
	for _, m := range ms {
		ss := c[m]
		if len(ss) == 0 {
			continue
		}
		vs := "–"
		for _, chain := range []string{cniWith, cniExecOnly} {
			if cmd, ok := strings.CutPrefix(m, chain+", "); ok && !strings.Contains(cmd, ",") {
				vs = ratioCell(spreadOf(paired(ss, c[cniKey(cniWithout, cmd)], p50Of)))
			}
		}
		t.rows = append(t.rows, []string{m, vs, cell(spreadOf(per(ss, p50Of)), 2), cell(spreadOf(per(ss, p99Of)), 2)})
	}
	t.notes = []string{r.cniNotes()}
	return t
}

// cniExcess is, per repetition, what nftredir-cni's ADD costs beyond its
// own start-up (VERSION) and the daemon's AddPod: connecting, reading the
// config and prevResult, the attachment record, printing the result.
func (r *report) cniExcess() spread {
	c := r.res.cni
	var v []float64
	for i, add := range c[cniPluginAdd] {
		if i < len(c[cniVersionRun]) && i < len(c[cniAddPod]) {
			v = append(v, add.p50()-c[cniVersionRun][i].p50()-c[cniAddPod][i].p50())
		}
	}
	return spreadOf(v)
}

func (r *report) cniTargets() []target {
	c := r.res.cni
	if len(c[cniPluginAdd]) == 0 {
		return nil
	}
	med := func(m string) float64 { return spreadOf(per(c[m], p50Of)).med }
	ex := r.cniExcess()
	chain := spreadOf(paired(c[cniKey(cniWith, "ADD+DEL")], c[cniKey(cniWithout, "ADD+DEL")], p50Of))
	addOnly := spreadOf(paired(c[cniKey(cniWith, "ADD")], c[cniKey(cniWithout, "ADD")], p50Of))
	return []target{
		{"nftredir-cni ADD ≤ its VERSION exec + AddPod p50 + 2 ms",
			fmt.Sprintf("%.2f = %.2f + %.2f + %s ms", med(cniPluginAdd), med(cniVersionRun), med(cniAddPod), cell(ex, 2)), ex.med <= 2},
		{"bridge + host-local + nftredir-cni ≤ 1.25× bridge + host-local (ADD+DEL p50)",
			fmt.Sprintf("%s (ADD alone %s)", ratioCell(chain), ratioCell(addOnly)), chain.med <= 1.25},
	}
}

func (r *report) cniTargetTable() table {
	t := table{title: "CNI targets", head: []string{"target", "measured", "result"}}
	for _, tg := range r.cniTargets() {
		v := "PASS"
		if !tg.pass {
			v = "MISS"
		}
		t.rows = append(t.rows, []string{tg.goal, tg.measured, v})
	}
	return t
}

// cniNotes explains the CNI table from the run's own figures.
func (r *report) cniNotes() string {
	c := r.res.cni
	if len(c[cniPluginAdd]) == 0 {
		return ""
	}
	med := func(m string) float64 { return spreadOf(per(c[m], p50Of)).med }
	// diff is a p50 minus another, per repetition, summarised.
	diff := func(a, b string) float64 {
		var v []float64
		for i := range min(len(c[a]), len(c[b])) {
			v = append(v, c[a][i].p50()-c[b][i].p50())
		}
		return spreadOf(v).med
	}
	ratio := func(chain, cmd string) string {
		return ratioCell(spreadOf(paired(c[cniKey(chain, cmd)], c[cniKey(cniWithout, cmd)], p50Of)))
	}
	add, ver, pod := med(cniPluginAdd), med(cniVersionRun), med(cniAddPod)
	del, rm := med(cniPluginDel), med(cniRemovePod)
	var sb strings.Builder
	fmt.Fprintf(&sb, "Appending nftredir-cni adds %.2f ms to the chain's ADD and %.2f ms to its DEL (p50 with − p50 without, per repetition). ",
		diff(cniKey(cniWith, "ADD"), cniKey(cniWithout, "ADD")), diff(cniKey(cniWith, "DEL"), cniKey(cniWithout, "DEL")))
	fmt.Fprintf(&sb, "Its ADD takes %.2f ms: %.2f ms (%.0f%%) is what any exec of it costs (its VERSION, which only starts and prints), "+
		"%.2f ms (%.0f%%) the daemon's AddPod as a client with a warm connection sees it, and %.2f ms (%.0f%%) the rest: a fresh connection, "+
		"reading the config and prevResult, the attachment record, printing the result, exiting. ",
		add, ver, 100*ver/add, pod, 100*pod/add, add-ver-pod, 100*(add-ver-pod)/add)
	if len(c[cniRemovePod]) > 0 {
		fmt.Fprintf(&sb, "Its DEL takes %.2f ms: %.2f ms its exec, %.2f ms the one RemovePod it sends (conditional on the namespace the attachment enrolled, "+
			"with namespace_teardown: the runtime deletes the namespace next) as a warm client sees it, and %.2f ms the rest. ",
			del, ver, rm, del-ver-rm)
	} else {
		fmt.Fprintf(&sb, "Its DEL takes %.2f ms. ", del)
	}
	fmt.Fprintf(&sb, "The floor of any chained plugin that is a process: the same chain with nftredir-cni excluding the pod's namespace "+
		"(it starts, reads its input and passes the result through, without calling the daemon) is %s the chain without it for ADD+DEL (%s for ADD). ",
		ratio(cniExecOnly, "ADD+DEL"), ratio(cniExecOnly, "ADD"))
	bw, bo, bx := med(bridgeIn(cniWith, "DEL")), med(bridgeIn(cniWithout, "DEL")), med(bridgeIn(cniExecOnly, "DEL"))
	fmt.Fprintf(&sb, "bridge's own DEL takes %.2f ms in the chain where nftredir-cni enrolled and then released the pod, against %.2f ms in the chain without it "+
		"and %.2f ms with the namespace excluded. ", bw, bo, bx)
	if excess := diff(bridgeIn(cniWith, "DEL"), bridgeIn(cniWithout, "DEL")); bridgeWaits(excess, bo) {
		fmt.Fprintf(&sb, "That %.2f ms is the kernel's, and lands in bridge's exec, not in nftredir-cni's: "+
			"deleting a network device ends in rcu_barrier(), which waits for every RCU callback queued anywhere, and the release has just "+
			"queued some if the daemon deleted the pod's table (nf_tables frees a deleted table after a grace period), changed a table in the node's "+
			"namespace (its probe table's sets lose the pod's addresses, freed the same way) or closed netlink sockets. Measured apart from this run with perf on this kernel (6.18): the veth deletion's wait is in "+
			"synchronize_rcu_expedited and rcu_barrier, and it is gone when the deletion comes 100 ms after the table's, so it is a wait, not work; "+
			"any table deleted just before costs it, with or without base chains, conntrack, NAT or tproxy. ", excess)
	} else {
		than := fmt.Sprintf("%.2f ms more than", excess)
		if excess < 0 {
			than = fmt.Sprintf("%.2f ms less than", -excess)
		}
		fmt.Fprintf(&sb, "The release leaves bridge's DEL nothing to wait for (%s without nftredir-cni, within the larger of %.1f ms and %.0f%% of that): "+
			"deleting a network device waits for the RCU callbacks queued before it, and a table the daemon leaves to the namespace's deletion "+
			"queues none before bridge runs. ", than, bridgeWaitFloor, 100*bridgeWaitShare)
	}
	fmt.Fprintf(&sb, "The chains are run by libcni (github.com/containernetworking/cni/libcni, the library podman, containerd and kubelet's runtimes use) from a thread "+
		"in the benchmark's node namespace, with libcni's cache, host-local's leases and nftredir-cni's records on the root filesystem (%s), as /var/lib is on a node; "+
		"every plugin's exec is timed through libcni's exec hook. Each round runs one pod through each chain (ADD then DEL, rotating which chain goes first), "+
		"one VERSION exec and one AddPod+RemovePod straight to the daemon, each on a fresh namespace that is deleted right after its DEL or RemovePod, "+
		"untimed, as runtimes delete a pod's namespace right after CNI DEL; what the namespace held, bridge's veth and any table the daemon left there, "+
		"is freed by the kernel's namespace cleanup, which runs apart from any caller. After each deletion the program pauses %v, so that no chain "+
		"is timed while that cleanup of another's namespace holds the locks its own steps need.", diskRoot, r.cfg.cniSettle)
	return sb.String()
}

// bridgeWaitShare is the excess of bridge's DEL in the chain with
// nftredir-cni, as a share of its DEL without, above which the report
// explains it as a wait for the kernel; below it, with bridgeWaitFloor,
// it is noise between chains.
const (
	bridgeWaitShare = 0.10
	bridgeWaitFloor = 0.5 // ms
)

// bridgeWaits reports whether bridge's DEL took excess ms more in the
// chain with nftredir-cni than the without ms it took in the chain
// without it, by more than noise.
func bridgeWaits(excess, without float64) bool {
	return excess > max(bridgeWaitFloor, bridgeWaitShare*without)
}
