// Command nftredir-bench measures nftredird against the iptables and
// nft-CLI ways of programming a pod, in one run on one machine: AddPod
// latency and throughput over the daemon's socket, where its time goes
// step by step, the CNI chain as a runtime runs it, reconcile at scale,
// the daemon's memory and fds, and the data path through capture. It
// prints the tables and writes BENCHMARKS.md with a chart; every figure
// and explanation in it is computed from the run.
//
// It must run as root: it creates network namespaces (all named
// nftr-bench-<pid>-*), starts nftredird, and loads rules into the
// namespaces it created. Everything is removed at the end, on error and on
// Ctrl-C; leftovers of a run that was killed are swept by the next one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// config is the run's shape, from flags.
type config struct {
	pods          int
	reps          int
	reconcilePods int
	cycles        int
	conc          []int
	out           string
	svg           string
	quick         bool
	daemon        string
	tmpfs         bool
	settle        time.Duration
	dpDuration    time.Duration
	dpConns       int
	dpConc        []int
	cyclePods     int
	cycleConc     int
	phasePods     int
	cniPods       int
	cniSettle     time.Duration
	cniBin        string
	onlyCNI       bool
	psRounds      int
	psPods        int
	onlyPodStart  bool
	noPodStart    bool
	// baselineDaemon is an earlier nftredird build measured beside this
	// one in the apply section; onlyBaseline runs that comparison alone.
	baselineDaemon string
	// baselineCNI is an earlier nftredir-cni build whose bare exec the pod
	// start section times turn about with this build's.
	baselineCNI  string
	onlyBaseline bool
	// args is the command line, for the report's "how to reproduce".
	args []string
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nftredir-bench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "nftredir-bench: %v\n", err)
		stop()
		os.Exit(1)
	}
}

func parseFlags(args []string, out io.Writer) (*config, error) {
	cfg := &config{args: args}
	fs := flag.NewFlagSet("nftredir-bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.IntVar(&cfg.pods, "pods", 200, "fresh namespaces per sample")
	fs.IntVar(&cfg.reps, "reps", 3, "repetitions of every measurement")
	fs.IntVar(&cfg.reconcilePods, "reconcile-pods", 1000, "recorded pods for the reconcile-at-scale and RSS measurements")
	fs.IntVar(&cfg.cycles, "cycles", 100000, "AddPod+RemovePod cycles for the leak check")
	concText := fs.String("conc", "1,4,8,16", "AddPod concurrency levels (calls in flight)")
	fs.StringVar(&cfg.out, "out", "BENCHMARKS.md", "report to write (empty: print only)")
	fs.StringVar(&cfg.svg, "svg", "docs/bench-latency.svg", "chart to write, linked from the report")
	fs.BoolVar(&cfg.quick, "quick", false, "smoke run: a few pods and cycles, tiny reconcile, short data-path samples; writes files only when -out is given")
	fs.StringVar(&cfg.daemon, "daemon", "", "nftredird binary (default: next to this program, else on PATH)")
	fs.BoolVar(&cfg.tmpfs, "tmpfs", true, "keep the daemon's state dir on a tmpfs, as /run is on a node")
	fs.DurationVar(&cfg.settle, "settle", 5*time.Second, "pause after deleting namespaces, while the kernel tears them down")
	fs.DurationVar(&cfg.dpDuration, "dp-duration", 5*time.Second, "time budget of one data-path sample")
	fs.IntVar(&cfg.dpConns, "dp-conns", 20000, "connection budget of one data-path sample")
	dpConcText := fs.String("dp-conc", "1,4", "data-path client concurrency levels")
	fs.IntVar(&cfg.cyclePods, "cycle-pods", 16, "namespaces the leak check rotates over")
	fs.IntVar(&cfg.cycleConc, "cycle-conc", 8, "leak-check calls in flight")
	fs.IntVar(&cfg.phasePods, "phase-pods", 100, "fresh namespaces for the in-process phase breakdown")
	fs.IntVar(&cfg.cniPods, "cni-pods", 40, "pods per chain and repetition in the CNI section")
	fs.DurationVar(&cfg.cniSettle, "cni-settle", 100*time.Millisecond, "CNI section: pause after deleting each pod's namespace, while the kernel tears it down, so no chain is timed in another's teardown")
	fs.StringVar(&cfg.cniBin, "cni-bin", "", "directory with bridge, host-local and nftredir-cni (default: this program's)")
	fs.BoolVar(&cfg.onlyCNI, "only-cni", false, "run only the CNI section; prints, writes nothing")
	fs.IntVar(&cfg.psRounds, "podstart-rounds", 12, "pod start section: rounds of its four variants (no nftredir, NRI not captured and captured, CNI captured), each followed by the standalone daemons' timing; the NRI target's sign test asks for at least "+strconv.Itoa(minSignRounds))
	fs.IntVar(&cfg.psPods, "podstart-pods", 4, "pod start section: pods per variant and round, each alone on the node, the variants of one enrolment mode taking turns")
	fs.BoolVar(&cfg.onlyPodStart, "only-podstart", false, "run only the pod start section (a real cluster; ZTUNNEL_BIN for stock ztunnel); prints, writes nothing")
	fs.BoolVar(&cfg.noPodStart, "no-podstart", false, "skip the pod start section (it needs make deps-k8s); the report then has no such section")
	fs.StringVar(&cfg.baselineDaemon, "baseline-daemon", "", "an earlier nftredird binary, measured with AddPod and RemovePod beside this build's in the apply section, interleaved")
	fs.StringVar(&cfg.baselineCNI, "baseline-cni", "", "an earlier nftredir-cni binary, its bare exec timed turn about with this build's in the pod start section")
	fs.BoolVar(&cfg.onlyBaseline, "only-baseline", false, "run only the AddPod/RemovePod comparison of this build with -baseline-daemon; prints, writes nothing")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.quick {
		quick := map[string]func(){
			"pods":            func() { cfg.pods = 4 },
			"reps":            func() { cfg.reps = 1 },
			"reconcile-pods":  func() { cfg.reconcilePods = 20 },
			"cycles":          func() { cfg.cycles = 200 },
			"settle":          func() { cfg.settle = 0 },
			"dp-duration":     func() { cfg.dpDuration = 300 * time.Millisecond },
			"dp-conns":        func() { cfg.dpConns = 300 },
			"dp-conc":         func() { *dpConcText = "1" },
			"cycle-pods":      func() { cfg.cyclePods = 4 },
			"phase-pods":      func() { cfg.phasePods = 4 },
			"cni-pods":        func() { cfg.cniPods = 3 },
			"cni-settle":      func() { cfg.cniSettle = 0 },
			"podstart-rounds": func() { cfg.psRounds = 1 },
			"podstart-pods":   func() { cfg.psPods = 2 },
			// A smoke run's numbers are not a measurement: it must
			// not overwrite the committed report unless told to.
			"out": func() { cfg.out = "" },
			"svg": func() { cfg.svg = "" },
		}
		for name, f := range quick {
			if !set[name] {
				f()
			}
		}
	}
	var err error
	if cfg.conc, err = intList(*concText); err != nil {
		return nil, fmt.Errorf("-conc: %w", err)
	}
	if cfg.dpConc, err = intList(*dpConcText); err != nil {
		return nil, fmt.Errorf("-dp-conc: %w", err)
	}
	switch {
	case cfg.pods < 2:
		return nil, errors.New("-pods must be at least 2")
	case cfg.reps < 1:
		return nil, errors.New("-reps must be at least 1")
	case cfg.reconcilePods < 1:
		return nil, errors.New("-reconcile-pods must be at least 1")
	case cfg.cycleConc < 1 || cfg.cycles < cfg.cycleConc:
		return nil, errors.New("-cycles must be at least -cycle-conc, which must be positive")
	case cfg.phasePods < 1:
		return nil, errors.New("-phase-pods must be positive")
	case cfg.cniPods < 1:
		return nil, errors.New("-cni-pods must be positive")
	case cfg.onlyCNI && set["out"]:
		return nil, errors.New("-only-cni writes no report: BENCHMARKS.md comes from a full run")
	case cfg.onlyPodStart && set["out"]:
		return nil, errors.New("-only-podstart writes no report: BENCHMARKS.md comes from a full run")
	case cfg.onlyPodStart && (cfg.onlyCNI || cfg.noPodStart):
		return nil, errors.New("-only-podstart goes with neither -only-cni nor -no-podstart")
	case cfg.onlyBaseline && cfg.baselineDaemon == "":
		return nil, errors.New("-only-baseline needs -baseline-daemon")
	case cfg.onlyBaseline && set["out"]:
		return nil, errors.New("-only-baseline writes no report: BENCHMARKS.md comes from a full run")
	case cfg.onlyBaseline && (cfg.onlyCNI || cfg.onlyPodStart):
		return nil, errors.New("-only-baseline goes with neither -only-cni nor -only-podstart")
	case cfg.baselineCNI != "" && (cfg.noPodStart || cfg.onlyCNI || cfg.onlyBaseline):
		return nil, errors.New("-baseline-cni is timed in the pod start section, which this run leaves out")
	case cfg.psRounds < 1 || cfg.psPods < 1:
		return nil, errors.New("-podstart-rounds and -podstart-pods must be positive")
	case cfg.dpConns < 1 || cfg.dpConns+dpWarmup > clientPorts[1]-clientPorts[0]:
		return nil, fmt.Errorf("-dp-conns must be in 1..%d: each connection of a sample needs its own client port", clientPorts[1]-clientPorts[0]-dpWarmup)
	case cfg.out == "" && cfg.svg != "" && set["svg"]:
		return nil, errors.New("-svg needs -out: the chart belongs to the report")
	}
	if cfg.onlyCNI || cfg.onlyPodStart || cfg.onlyBaseline {
		cfg.out = ""
	}
	if cfg.out == "" {
		cfg.svg = ""
	}
	return cfg, nil
}

func intList(s string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", part)
		}
		out = append(out, n)
	}
	return out, nil
}

// bench is one run's state: what it created, so cleanup finds it all.
type bench struct {
	cfg       *config
	pool      *pool
	guard     *netns.Guard
	work      string
	nodeNetns string // the daemons' stand-in for the node's namespace
	daemons   map[*daemon]bool
	wantRules int
	// baseRules is the rule count of the baseline build's table, learnt
	// from the first pod it programs: an earlier build may have programmed
	// a different ruleset, which is a finding, not a failure.
	baseRules int
	log       io.Writer
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// sleep pauses unless ctx ends first.
func (b *bench) sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (b *bench) startDaemon(dir string, extra ...string) (*daemon, error) {
	return b.startDaemonOf(b.cfg.daemon, dir, b.nodeNetns, extra...)
}

// startDaemonOf starts a daemon of any build on any node namespace and
// tracks it, so that cleanup stops it on every path out of the run.
func (b *bench) startDaemonOf(bin, dir, nodeNetns string, extra ...string) (*daemon, error) {
	d, err := startDaemon(bin, dir, nodeNetns, extra...)
	if err != nil {
		return nil, err
	}
	b.daemons[d] = true
	return d, nil
}

func (b *bench) stopDaemon(d *daemon) error {
	if !b.daemons[d] {
		return nil
	}
	delete(b.daemons, d)
	return d.stop()
}

// results is everything a run measured.
type results struct {
	apply    map[string][]*sample // by method, one per repetition
	phases   map[string][]time.Duration
	dp       map[string][]*sample // by dpKey
	cni      map[string][]*sample // by the CNI section's method names
	podStart *podStartResult
	baseline *baselineInfo // nil without -baseline-daemon
	scale    *scaleResult
	cycles   *cycleResult
	machine  machine
	started  time.Time
	duration time.Duration
	loadEnd  float64
}

func dpKey(method string, conc int) string { return fmt.Sprintf("%s, %d concurrent", method, conc) }

func run(ctx context.Context, cfg *config, stdout, stderr io.Writer) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("must run as root: it creates network namespaces and starts nftredird")
	}
	b := &bench{cfg: cfg, pool: newPool(), daemons: map[*daemon]bool{}, log: stderr}
	if b.cfg.daemon, err = findDaemon(cfg.daemon); err != nil {
		return err
	}
	// Checked before anything is created: a typo should cost nothing.
	for _, f := range []struct {
		flag string
		path *string
	}{{"-baseline-daemon", &b.cfg.baselineDaemon}, {"-baseline-cni", &b.cfg.baselineCNI}} {
		if *f.path == "" {
			continue
		}
		if *f.path, err = filepath.Abs(*f.path); err != nil {
			return err
		}
		if fi, err := os.Stat(*f.path); err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s: %s is not an executable file", f.flag, *f.path)
		}
	}
	if n, err := sweep(); err != nil {
		return fmt.Errorf("sweeping leftovers of earlier runs: %w", err)
	} else if n > 0 {
		b.progress("removed %d leftovers of earlier runs", n)
	}
	rs, err := nft.Build(nft.DefaultSpec("bench"))
	if err != nil {
		return err
	}
	for _, ch := range rs.Chains {
		b.wantRules += len(ch.Rules)
	}
	if b.guard, err = netns.NewGuard(); err != nil {
		return err
	}
	if b.work, err = newWorkDir(cfg.tmpfs); err != nil {
		return err
	}
	defer func() {
		var errs []error
		for d := range b.daemons {
			errs = append(errs, d.stop())
		}
		errs = append(errs, b.pool.removeAll(), removeWorkDir(b.work))
		if cerr := errors.Join(errs...); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()

	node, err := b.pool.create(1, "node")
	if err != nil {
		return err
	}
	b.nodeNetns = nsPath(node[0])

	res := &results{apply: map[string][]*sample{}, dp: map[string][]*sample{}, cni: map[string][]*sample{}, started: time.Now()}
	res.machine = describeMachine(cfg.daemon)
	if cfg.baselineDaemon != "" {
		res.baseline = &baselineInfo{bin: cfg.baselineDaemon, version: daemonVersion(ctx, cfg.baselineDaemon)}
		b.progress("baseline daemon %s: %s", cfg.baselineDaemon, res.baseline.version)
	}
	b.progress("nftredir-bench on %s, %d cores, kernel %s, load %.2f; daemon %s", res.machine.cpu, res.machine.cores, res.machine.kernel, res.machine.loadStart, cfg.daemon)

	mainDir := filepath.Join(b.work, "main")
	if err := os.Mkdir(mainDir, 0o700); err != nil {
		return err
	}
	d, err := b.startDaemon(mainDir)
	if err != nil {
		return err
	}
	if _, err := d.waitServing(ctx, time.Minute); err != nil {
		return err
	}

	if cfg.onlyCNI {
		if err := b.cniPhase(ctx, d, res); err != nil {
			return err
		}
		rep := newReport(cfg, res)
		fmt.Fprint(stdout, rep.cniTable().text())
		fmt.Fprint(stdout, rep.cniTargetTable().text())
		fmt.Fprint(stdout, "\n"+rep.cniNotes())
		return nil
	}
	if cfg.onlyPodStart {
		if err := b.podStartPhase(ctx, d, res); err != nil {
			return err
		}
		rep := newReport(cfg, res)
		for _, t := range rep.podStartTables() {
			fmt.Fprint(stdout, t.text())
		}
		fmt.Fprint(stdout, "\n"+rep.podStartNotes())
		return nil
	}
	if cfg.onlyBaseline {
		if err := b.applyPhase(ctx, d, res, false); err != nil {
			return err
		}
		rep := newReport(cfg, res)
		t := rep.baselineTable()
		fmt.Fprint(stdout, t.text())
		fmt.Fprint(stdout, "\n"+strings.Join(t.notes, "\n\n")+"\n")
		fmt.Fprintf(stdout, "\nThis build: %s (revision %s). Baseline: %s (%s).\n", cfg.daemon, res.machine.revision, res.baseline.bin, res.baseline.version)
		return nil
	}
	if err := b.applyPhase(ctx, d, res, true); err != nil {
		return err
	}
	b.progress("phase breakdown: %d fresh namespaces, in process", cfg.phasePods)
	if res.phases, err = b.phases(ctx, d); err != nil {
		return err
	}
	if err := b.cniPhase(ctx, d, res); err != nil {
		return err
	}
	if err := b.dataPathPhase(ctx, d, res); err != nil {
		return err
	}
	if !cfg.noPodStart {
		if err := b.podStartPhase(ctx, d, res); err != nil {
			return err
		}
	}
	if err := b.stopDaemon(d); err != nil {
		return err
	}
	b.sleep(ctx, cfg.settle)
	if res.scale, err = b.reconcileScale(ctx); err != nil {
		return err
	}
	b.sleep(ctx, cfg.settle)
	b.progress("leak check: %d AddPod+RemovePod cycles over %d namespaces, %d in flight", cfg.cycles, cfg.cyclePods, cfg.cycleConc)
	if res.cycles, err = b.cycleCheck(ctx); err != nil {
		return err
	}
	res.duration = time.Since(res.started)
	res.loadEnd = loadAvg()

	rep := newReport(cfg, res)
	fmt.Fprint(stdout, rep.text())
	if cfg.out != "" {
		if err := rep.write(cfg.out, cfg.svg); err != nil {
			return err
		}
		b.progress("wrote %s and %s", cfg.out, cfg.svg)
	}
	return nil
}

// applyPhase measures AddPod at each concurrency and the two baselines,
// interleaved: each repetition runs every method once, in an order that
// rotates, so drift in the machine's load spreads over all methods. With
// -baseline-daemon the earlier build's daemon is measured in the same
// rotation; withCLI false leaves the exec-based baselines out.
func (b *bench) applyPhase(ctx context.Context, d *daemon, res *results, withCLI bool) (err error) {
	var base *baselineDaemon
	if res.baseline != nil {
		if base, err = b.startBaseline(ctx); err != nil {
			return err
		}
		defer func() {
			res.baseline.rules, res.baseline.thisRules = b.baseRules, b.wantRules
			err = errors.Join(err, b.stopBaseline(base))
		}()
	}
	type job struct {
		name string
		run  func(rep int) error
	}
	daemonJob := func(dm *daemon, conc int, baseline bool) job {
		name := mAdd(conc)
		if baseline {
			name = mAddBase(conc)
		}
		return job{name, func(rep int) error {
			add, remove, err := b.addPodSample(ctx, dm, conc, rep, baseline)
			if err != nil {
				return err
			}
			res.apply[add.method] = append(res.apply[add.method], add)
			res.apply[remove.method] = append(res.apply[remove.method], remove)
			b.progress("  %-46s p50 %6.2f ms  p99 %6.2f ms  %7.0f pods/s  (remove p50 %.2f ms; load %.2f)", add.method, add.p50(), add.p99(), add.rate(), remove.p50(), add.load)
			return nil
		}}
	}
	jobsFor := func(rep int) []job {
		var jobs []job
		for i, conc := range b.cfg.conc {
			pair := []job{daemonJob(d, conc, false)}
			if base != nil {
				pair = append(pair, daemonJob(base.d, conc, true))
				// The two builds at one level sit next to each other, so
				// their ratio compares samples close in time; which goes
				// first alternates, so neither always runs in the other's
				// wake (its namespaces' teardown, its warmed caches).
				if rep%2 == 1 {
					pair[0], pair[1] = pair[1], pair[0]
				}
			}
			jobs = append(jobs, pair...)
			if i == 0 && withCLI {
				// The baselines sit next to the sequential AddPod they are
				// compared with.
				for _, m := range []string{mIPT, mNFT} {
					jobs = append(jobs, job{m, func(rep int) error {
						s, err := b.cliSample(ctx, m, rep)
						if err != nil {
							return err
						}
						res.apply[m] = append(res.apply[m], s)
						b.progress("  %-46s p50 %6.2f ms  p99 %6.2f ms  %7.1f pods/s  (load %.2f)", m, s.p50(), s.p99(), s.rate(), s.load)
						return nil
					}})
				}
			}
		}
		return jobs
	}
	for rep := range b.cfg.reps {
		b.progress("apply, repetition %d/%d: %d fresh namespaces per method", rep+1, b.cfg.reps, b.cfg.pods)
		jobs := jobsFor(rep)
		for k := range jobs {
			j := jobs[(k+rep)%len(jobs)]
			if err := j.run(rep); err != nil {
				return fmt.Errorf("%s: %w", j.name, err)
			}
			b.sleep(ctx, b.cfg.settle)
		}
	}
	return nil
}

func (b *bench) dataPathPhase(ctx context.Context, d *daemon, res *results) error {
	methods := []string{dpNftredir, dpPeer, dpNone}
	for rep := range b.cfg.reps {
		b.progress("data path, repetition %d/%d", rep+1, b.cfg.reps)
		for _, conc := range b.cfg.dpConc {
			for k := range methods {
				m := methods[(k+rep)%len(methods)]
				s, err := b.dataPathSample(ctx, d, m, conc, rep)
				if err != nil {
					return err
				}
				key := dpKey(m, conc)
				res.dp[key] = append(res.dp[key], s)
				b.progress("  %-44s %8.0f conn/s  p50 %5.0f µs  p99 %5.0f µs  (%d conns; load %.2f)", key, s.rate(), usf(newDist(s.lat).q(0.5)), usf(newDist(s.lat).q(0.99)), len(s.lat), s.load)
			}
		}
	}
	return nil
}

// findDaemon resolves the nftredird binary: the flag, else the one built
// next to this program (make build puts both in bin/), else PATH.
func findDaemon(flagValue string) (string, error) {
	if flagValue != "" {
		return filepath.Abs(flagValue)
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "nftredird")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("nftredird")
	if err != nil {
		return "", errors.New("nftredird not found next to this program or on PATH; build it (make build) or pass -daemon")
	}
	return filepath.Abs(p)
}
