package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nftredir/nftredir/lifecycle"
)

// table is one table of the report, rendered as aligned text for the
// terminal and as Markdown for BENCHMARKS.md.
type table struct {
	title string
	head  []string
	rows  [][]string
	notes []string
}

func (t table) text() string {
	w := make([]int, len(t.head))
	for _, r := range append([][]string{t.head}, t.rows...) {
		for i, c := range r {
			w[i] = max(w[i], len([]rune(c)))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%s\n", t.title)
	line := func(r []string) {
		for i, c := range r {
			pad := w[i] - len([]rune(c))
			if i == 0 {
				sb.WriteString(c + strings.Repeat(" ", pad))
			} else {
				sb.WriteString("  " + strings.Repeat(" ", pad) + c)
			}
		}
		sb.WriteString("\n")
	}
	line(t.head)
	total := len(w)*2 - 2
	for _, x := range w {
		total += x
	}
	sb.WriteString(strings.Repeat("-", total) + "\n")
	for _, r := range t.rows {
		line(r)
	}
	return sb.String()
}

func (t table) markdown() string {
	var sb strings.Builder
	sb.WriteString("| " + strings.Join(t.head, " | ") + " |\n|")
	for i := range t.head {
		if i == 0 {
			sb.WriteString("---|")
		} else {
			sb.WriteString("---:|")
		}
	}
	sb.WriteString("\n")
	for _, r := range t.rows {
		sb.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	for _, n := range t.notes {
		sb.WriteString("\n" + n + "\n")
	}
	return sb.String()
}

// report turns results into tables, a verdict per target, and files.
type report struct {
	cfg *config
	res *results
}

func newReport(cfg *config, res *results) *report { return &report{cfg: cfg, res: res} }

// cell renders a spread over repetitions: "median [min–max]", or just
// the value when there was one repetition.
func cell(s spread, prec int) string {
	if math.IsNaN(s.med) {
		return "–"
	}
	if s.n <= 1 || s.lo == s.hi {
		return fmt.Sprintf("%.*f", prec, s.med)
	}
	return fmt.Sprintf("%.*f [%.*f–%.*f]", prec, s.med, prec, s.lo, prec, s.hi)
}

// speedText says how much faster nftredir was from a ratio baseline ÷
// nftredir, or how much slower when the ratio is below 1.
func speedText(s spread) string {
	if math.IsNaN(s.med) {
		return "no ratio"
	}
	if s.med >= 1 {
		return ratioCell(s) + " faster"
	}
	return ratioCell(spread{med: 1 / s.med, lo: 1 / s.hi, hi: 1 / s.lo, n: s.n}) + " slower"
}

func ratioCell(s spread) string {
	if math.IsNaN(s.med) {
		return "–"
	}
	prec := 1
	switch {
	case s.med < 2:
		// Near-ties: show the third digit that decides a parity verdict.
		prec = 3
	case s.med < 10:
		prec = 2
	}
	if s.n <= 1 || s.lo == s.hi {
		return fmt.Sprintf("%.*f×", prec, s.med)
	}
	return fmt.Sprintf("%.*f× [%.*f–%.*f]", prec, s.med, prec, s.lo, prec, s.hi)
}

func (r *report) addMethods() []string {
	var ms []string
	for _, c := range r.cfg.conc {
		ms = append(ms, mAdd(c))
	}
	return ms
}

func (r *report) removeMethods() []string {
	var ms []string
	for _, c := range r.cfg.conc {
		ms = append(ms, mRemove(c))
	}
	return ms
}

// seqAdd is the sequential AddPod, the one the baselines (also
// sequential) are compared with.
func (r *report) seqAdd() []*sample { return r.res.apply[mAdd(r.cfg.conc[0])] }

func p50Of(s *sample) float64   { return s.p50() }
func p99Of(s *sample) float64   { return s.p99() }
func rateOf(s *sample) float64  { return s.rate() }
func cpuOf(s *sample) float64   { return s.cpuPer() }
func p50usOf(s *sample) float64 { return usf(newDist(s.lat).q(0.5)) }
func p99usOf(s *sample) float64 { return usf(newDist(s.lat).q(0.99)) }
func connsOf(s *sample) float64 { return float64(len(s.lat)) }

func (r *report) applyTable() table {
	t := table{
		title: fmt.Sprintf("Programming one pod: %d fresh namespaces per sample, %d repetitions, median [min–max] over repetitions", r.cfg.pods, r.cfg.reps),
		head:  []string{"method", "iptables p50 ÷ this p50", "nft -f p50 ÷ this p50", "p50 ms", "p99 ms", "pods/s", "CPU ms/pod", "in the daemon p50 ms"},
	}
	ipt, nftc := r.res.apply[mIPT], r.res.apply[mNFT]
	for _, m := range slices.Concat(r.addMethods(), []string{mIPT, mNFT}, r.removeMethods()) {
		ss := r.res.apply[m]
		if len(ss) == 0 {
			continue
		}
		vsIPT, vsNFT := "–", "–"
		// Latency ratios are meaningful for the sequential calls, which
		// wait for nothing but their own work; concurrent calls also wait
		// for each other.
		if ss[0].conc == 1 && !strings.Contains(m, "RemovePod") {
			vsIPT = ratioCell(spreadOf(paired(ipt, ss, p50Of)))
			vsNFT = ratioCell(spreadOf(paired(nftc, ss, p50Of)))
		}
		t.rows = append(t.rows, []string{m, vsIPT, vsNFT,
			cell(spreadOf(per(ss, p50Of)), 2), cell(spreadOf(per(ss, p99Of)), 2),
			cell(spreadOf(per(ss, rateOf)), 0), cell(spreadOf(per(ss, cpuOf)), 2), daemonCell(ss)})
	}
	t.notes = []string{
		"Ratios are taken within each repetition (baseline p50 ÷ nftredir p50) and then summarised, so a change of the machine's load from one repetition to the next weighs on both sides of a ratio. " +
			"nftredir's times are client-side, over the daemon's Unix socket: validation, namespace open and check, the durable state record, policy routing, the nft table, the node probe set, and the gRPC round trip. " +
			"pods/s is pods ÷ wall time of the whole batch. CPU ms/pod is the daemon's plus this program's CPU time (for the baselines: this program's plus its children's) ÷ pods. " +
			"\"In the daemon\" is the daemon's own measure of each call (its log's grpc.time_ms, from its first interceptor to the handler's return); the rest of the end-to-end time is the client and the transport.",
	}
	return t
}

func inDaemonP50(s *sample) float64 { return msf(newDist(s.inDaemon).q(0.5)) }

// daemonCell is the calls' time inside the daemon, for the methods that
// have a daemon.
func daemonCell(ss []*sample) string {
	if len(ss[0].inDaemon) == 0 {
		return "–"
	}
	return cell(spreadOf(per(ss, inDaemonP50)), 2)
}

func (r *report) baselineSteps() table {
	t := table{
		title: "The baselines' commands, p50 over every pod of every repetition",
		head:  []string{"method", "command", "p50 ms", "p99 ms"},
	}
	for _, m := range []string{mIPT, mNFT} {
		ss := r.res.apply[m]
		if len(ss) == 0 {
			continue
		}
		var names []string
		for _, st := range iptablesSteps("NS") {
			names = append(names, st.name)
		}
		if m == mNFT {
			names[0] = "nft -f"
		}
		for _, name := range names {
			var all []time.Duration
			for _, s := range ss {
				all = append(all, s.phases[name]...)
			}
			d := newDist(all)
			t.rows = append(t.rows, []string{m, name, fmt.Sprintf("%.2f", msf(d.q(0.5))), fmt.Sprintf("%.2f", msf(d.q(0.99)))})
		}
	}
	return t
}

func (r *report) phaseTable() table {
	t := table{
		title: fmt.Sprintf("Where AddPod's time goes: its steps timed one by one in this process, in the daemon's order, on %d fresh namespaces", r.cfg.phasePods),
		head:  []string{"step", "share of AddPod's steps", "p50 ms", "p99 ms"},
	}
	var sum float64
	for _, name := range addPhases {
		sum += r.phaseP50(name)
	}
	row := func(label, name string, share bool) {
		d := newDist(r.res.phases[name])
		if len(d) == 0 {
			return
		}
		sh := ""
		if share {
			sh = fmt.Sprintf("%.0f%%", 100*msf(d.q(0.5))/sum)
		}
		t.rows = append(t.rows, []string{label, sh, fmt.Sprintf("%.3f", msf(d.q(0.5))), fmt.Sprintf("%.3f", msf(d.q(0.99)))})
	}
	for _, name := range addPhases {
		row("AddPod: "+name, name, true)
	}
	row("AddPod: all these steps, per pod", phAddTotal, false)
	if k := r.kernelSum(); k > 0 {
		t.rows = append(t.rows, []string{"AddPod's kernel phases (" + kernelPhasesText() + "), sum of the p50s", "", fmt.Sprintf("%.3f", k), ""})
	}
	seq := r.seqAdd()
	t.rows = append(t.rows,
		[]string{"AddPod inside the daemon, sequential (its log)", "", cell(spreadOf(per(seq, inDaemonP50)), 3), ""},
		[]string{"AddPod end to end over the daemon, sequential (table above)", "", cell(spreadOf(per(seq, p50Of)), 3), cell(spreadOf(per(seq, p99Of)), 3)})
	for _, name := range removePhases[1:] {
		row("RemovePod: "+name, name, false)
	}
	n := r.cfg.reconcilePods
	row("AddPod: "+probeAt(phProbe, n), probeAt(phProbe, n), false)
	row("RemovePod: "+probeAt(phProbeDel, n), probeAt(phProbeDel, n), false)
	row("not in AddPod: "+phCounted, phCounted, false)
	row("not in AddPod: "+phUncounted, phUncounted, false)
	row("not in AddPod: "+phPutDisk, phPutDisk, false)
	row("not in AddPod: "+phForkExec, phForkExec, false)
	row("not in AddPod: "+phForkExec2, phForkExec2, false)
	t.notes = []string{r.phaseNotes()}
	return t
}

// kernelPhases are the steps of AddPod that are kernel work on the pod's
// and the node's namespaces, in the daemon's order: the floor of an
// AddPod, which the daemon's own time is compared with.
var kernelPhases = []string{phRouting, phApply, phProbe}

// kernelPhasesText names the kernel phases in prose.
func kernelPhasesText() string { return "ip rule + route, nft table, node probe set" }

// phaseP50 is a step's p50 in ms, as timed one by one in this process (0
// when the run did not time it).
func (r *report) phaseP50(name string) float64 { return msf(newDist(r.res.phases[name]).q(0.5)) }

// kernelSum is the sum of the kernel phases' p50s, in ms; 0 unless every
// one of them was timed.
func (r *report) kernelSum() float64 {
	var sum float64
	for _, name := range kernelPhases {
		if len(r.res.phases[name]) == 0 {
			return 0
		}
		sum += r.phaseP50(name)
	}
	return sum
}

// kernelRatio is, per repetition, the sequential AddPod's p50 inside the
// daemon (its log) ÷ kernelSum: how much the daemon adds to the kernel
// work it cannot avoid.
func (r *report) kernelRatio() spread {
	k := r.kernelSum()
	var v []float64
	for _, s := range r.seqAdd() {
		if len(s.inDaemon) > 0 && k > 0 {
			v = append(v, inDaemonP50(s)/k)
		}
	}
	return spreadOf(v)
}

// phaseNotes says what the phase table's figures are and how they relate,
// from the run's own numbers.
func (r *report) phaseNotes() string {
	var sb strings.Builder
	sb.WriteString("The steps are the daemon's building blocks (`netns.Guard.Open`, `nft.Build`, `state.Store`, `netns.EnsureRouting`, " +
		"`nft.Netlink.Apply`, `probe.Manager` on a namespace standing in for the node, a grpc.health.v1 Check for the round trip) called one at a time " +
		"from this program. ")
	total := r.phaseP50(phAddTotal)
	e2e := spreadOf(per(r.seqAdd(), p50Of)).med
	if total > 0 && e2e > 0 {
		fmt.Fprintf(&sb, "Their per-pod total is %.3f ms at p50, %.2f× the sequential AddPod's end-to-end p50 (%.3f ms). ",
			total, total/e2e, e2e)
	}
	if kr := r.kernelRatio(); !math.IsNaN(kr.med) {
		fmt.Fprintf(&sb, "Inside the daemon an AddPod takes %s the sum of its kernel phases' p50s (%.3f ms). ", ratioCell(kr), r.kernelSum())
	}
	n := r.cfg.reconcilePods
	few, many := r.phaseP50(phProbe), r.phaseP50(probeAt(phProbe, n))
	fewDel, manyDel := r.phaseP50(phProbeDel), r.phaseP50(probeAt(phProbeDel, n))
	if few > 0 && many > 0 {
		fmt.Fprintf(&sb, "The node probe set is shared by all pods, and the daemon sends it only the change: with %d pods in it an add takes %.3f ms "+
			"against %.3f ms with a few (%.2f×), and a removal %.3f ms against %.3f ms. ", n, many, few, many/few, manyDel, fewDel)
	}
	if with, without := r.phaseP50(phCounted), r.phaseP50(phUncounted); with > 0 && without > 0 {
		fmt.Fprintf(&sb, "Every rule carries a counter (support's first question is whether traffic hits a rule): on fresh namespaces, "+
			"alternating, the table with counters takes %.3f ms at p50 against %.3f ms without them (%.2f×). ", with, without, with/without)
	}
	sb.WriteString("The disk write and fork+exec rows are for comparison: a state dir on disk, and what every command of " +
		"the exec-based baselines pays before it does any work.")
	return sb.String()
}

func (r *report) scaleTable() table {
	s := r.res.scale
	t := table{
		title: fmt.Sprintf("Reconcile at scale: nftredird started over %d recorded pods, time from process start to health SERVING", s.pods),
		head:  []string{"case", "start → SERVING ms", "÷ pods, ms"},
	}
	dur := func(ds []time.Duration) []float64 {
		out := make([]float64, len(ds))
		for i, d := range ds {
			out[i] = msf(d)
		}
		return out
	}
	perPod := func(ds []time.Duration) spread {
		sp := spreadOf(dur(ds))
		n := float64(s.pods)
		return spread{med: sp.med / n, lo: sp.lo / n, hi: sp.hi / n, n: sp.n}
	}
	t.rows = [][]string{
		{"no records (empty state dir)", fmt.Sprintf("%.0f", msf(s.emptyStart)), "–"},
		{fmt.Sprintf("%d pods, all in sync (checked, nothing to do)", s.pods), cell(spreadOf(dur(s.inSync)), 0), cell(perPod(s.inSync), 3)},
		{fmt.Sprintf("%d pods, every table deleted behind its back (all re-applied)", s.pods), cell(spreadOf(dur(s.reapply)), 0), cell(perPod(s.reapply), 3)},
	}
	t.notes = []string{fmt.Sprintf("The %d records were made by %d AddPods, %d in flight: %.0f pods/s (p50 %.2f ms, p99 %.2f ms). "+
		"The daemon reconciles with %d workers, its default; records are on tmpfs%s.",
		s.pods, s.pods, scaleConc, s.enrol.rate(), s.enrol.p50(), s.enrol.p99(), lifecycle.DefaultReconcileWorkers, r.tmpfsNote())}
	return t
}

func (r *report) tmpfsNote() string {
	if r.cfg.tmpfs {
		return ""
	}
	return " (no: -tmpfs=false, the state dir is on the root filesystem)"
}

func (r *report) resourceTable() table {
	s, c := r.res.scale, r.res.cycles
	t := table{
		title: "The daemon's memory (VmRSS) and open file descriptors",
		head:  []string{"state", "RSS MiB", "of which anonymous MiB", "open fds"},
	}
	m := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	t.rows = [][]string{
		{"started, 0 pods", m(s.rss0), m(s.anon0), fmt.Sprint(s.fds0)},
		{fmt.Sprintf("%d pods enrolled by AddPod", s.pods), m(s.rssN), m(s.anonN), fmt.Sprint(s.fdsN)},
		{fmt.Sprintf("restarted over %d pods (after reconcile)", s.pods), m(s.rssRestart), m(s.anonRestart), fmt.Sprint(s.fdsRestart)},
		{fmt.Sprintf("leak check: after %d warm-up cycles", max(c.conc, r.cfg.cycles/20)), "", m(c.before.rss), fmt.Sprint(c.before.fds)},
		{fmt.Sprintf("leak check: after %d more cycles", c.cycles), "", m(c.after.rss), fmt.Sprint(c.after.fds)},
		{"leak check: change, last − first reading", "", fmt.Sprintf("%+.2f", float64(c.after.rss-c.before.rss)/(1<<20)), fmt.Sprintf("%+d", c.after.fds-c.before.fds)},
		{"leak check: change, medians of the last and first 3 readings", "", fmt.Sprintf("%+.2f", float64(c.trend())/(1<<20)), ""},
	}
	var series []string
	for _, p := range c.series {
		series = append(series, fmt.Sprintf("%d: %.1f MiB/%d", p.cycles, float64(p.rss)/(1<<20), p.fds))
	}
	rate := float64(c.cycles) / c.wall.Seconds()
	note := fmt.Sprintf("Leak check: %d AddPod+RemovePod cycles over %d namespaces, %d in flight, in %v (%.0f cycles/s).",
		c.cycles, c.pods, c.conc, c.wall.Round(time.Second), rate)
	if c.cycles < 100000 {
		note += fmt.Sprintf(" At that rate 100,000 cycles would take %v.", (time.Duration(100000/rate) * time.Second).Round(time.Minute))
	}
	file0, fileN := s.rss0-s.anon0, s.rssN-s.anonN
	t.notes = []string{
		fmt.Sprintf("Of VmRSS, %.1f MiB at start and %.1f MiB with %d pods are pages of the executable (VmRSS − RssAnon): they count for as much of the file as the page cache holds and the kernel maps around each fault, so they move with the node's page cache, not with the daemon's work, and are shared with anything else mapping the file. The daemon's own memory grew by %.1f MiB for %d pods.",
			float64(file0)/(1<<20), float64(fileN)/(1<<20), s.pods, float64(s.anonN-s.anon0)/(1<<20), s.pods),
		note + fmt.Sprintf(" RssAnon/fds every tenth (the executable's pages left out, as they move with the page cache): %s.", strings.Join(series, ", ")),
	}
	return t
}

func (r *report) dpTable() table {
	t := table{
		title: fmt.Sprintf("Data path: connect + 1 byte each way + close, client namespace → pod namespace, %d repetitions, median [min–max]", r.cfg.reps),
		head:  []string{"method", "conn/s vs iptables", "conn/s", "p50 µs", "p99 µs", "conns/sample"},
	}
	for _, conc := range r.cfg.dpConc {
		peer := r.res.dp[dpKey(dpPeer, conc)]
		for _, m := range []string{dpNftredir, dpPeer, dpNone} {
			ss := r.res.dp[dpKey(m, conc)]
			if len(ss) == 0 {
				continue
			}
			t.rows = append(t.rows, []string{dpKey(m, conc), ratioCell(spreadOf(paired(ss, peer, rateOf))),
				cell(spreadOf(per(ss, rateOf)), 0), cell(spreadOf(per(ss, p50usOf)), 0), cell(spreadOf(per(ss, p99usOf)), 0),
				cell(spreadOf(per(ss, connsOf)), 0)})
		}
	}
	t.notes = []string{fmt.Sprintf("Each sample builds a fresh client and pod namespace pair joined by a veth, programs the pod (nftredir: AddPod through the daemon; "+
		"iptables: the peer's ruleset with iptables-restore and the same ip rule and route; reference: nothing), and puts a transparent listener with the proxy mark "+
		"in the pod as the proxy. Clients (each in the client namespace) connect to %s:%d, which capture delivers to the listener on %d; the listener checks "+
		"that every accepted socket's local address is the original destination. A sample stops after %v or %d connections. Methods are interleaved.",
		dpPodAddr, dpAppPort, dpProxyPort, r.cfg.dpDuration, r.cfg.dpConns)}
	return t
}

// target is one goal of the issue with its verdict.
type target struct {
	goal, measured string
	pass           bool
}

func (r *report) targets() []target {
	var ts []target
	add := func(goal string, pass bool, format string, args ...any) {
		ts = append(ts, target{goal, fmt.Sprintf(format, args...), pass})
	}
	seq := r.seqAdd()
	if kr := r.kernelRatio(); !math.IsNaN(kr.med) {
		add(goalKernel, kr.med <= maxKernelRatio, "%s = %s ms ÷ %.3f ms", ratioCell(kr), cell(spreadOf(per(seq, inDaemonP50)), 3), r.kernelSum())
	}
	if floor := r.e2eFloor(); floor > 0 {
		e2e := spreadOf(per(seq, func(s *sample) float64 { return p50Of(s) / floor }))
		add(goalE2E, e2e.med <= maxE2ERatio, "%s = %s ms ÷ (%.3f + %.3f) ms", ratioCell(e2e), cell(spreadOf(per(seq, p50Of)), 3), r.kernelSum(), r.phaseP50(phRPC))
	}
	if c8 := r.res.apply[mAdd(rateConc)]; len(c8) > 0 {
		rate := spreadOf(per(c8, rateOf))
		add(goalRate, rate.med >= minRate, "%s pods/s", cell(rate, 0))
	}
	s := r.res.scale
	durs := func(ds []time.Duration) spread {
		v := make([]float64, len(ds))
		for i, d := range ds {
			v[i] = d.Seconds()
		}
		return spreadOf(v)
	}
	in, re := durs(s.inSync), durs(s.reapply)
	add(fmt.Sprintf("reconcile %d pods in sync ≤ 1 s", s.pods), in.med <= 1, "%s s", cell(in, 2))
	_ = re // all re-applied: a figure of the scale table, not a target
	anonMax := max(s.anonN, s.anonRestart)
	add(fmt.Sprintf("RssAnon ≤ %d MiB with %d pods", maxAnonMiB, s.pods), anonMax <= maxAnonMiB<<20, "%s (largest of after AddPods and after restart; VmRSS %s)", mib(anonMax), mib(max(s.rssN, s.rssRestart)))
	ts = append(ts, r.cniTargets()...)
	ts = append(ts, r.podStartTargets()...)
	c := r.res.cycles
	grow := c.trend()
	add(fmt.Sprintf("no memory or fd growth over %d cycles", c.cycles), grow <= leakTolerance && c.after.fds <= c.before.fds,
		"RssAnon %+.2f MiB (end − start, medians of 3 readings), fds %+d", float64(grow)/(1<<20), c.after.fds-c.before.fds)
	for _, conc := range r.cfg.dpConc {
		ratio := spreadOf(paired(r.res.dp[dpKey(dpNftredir, conc)], r.res.dp[dpKey(dpPeer, conc)], rateOf))
		add(fmt.Sprintf("data path conn/s at parity with the iptables ruleset or better, ratio ≥ %.2f (%d concurrent)", parity, conc), ratio.med >= parity, "%s", ratioCell(ratio))
	}
	return ts
}

// The AddPod targets, as ratios to the work no AddPod can skip, measured
// in the same run. The ratios against iptables-restore and nft -f stay in
// the apply table as figures: they measure the baselines' process
// start-up on this machine more than nftredir. Their goal texts name them
// in the targets table and in the notes that explain a miss.
const (
	maxKernelRatio = 1.25 // daemon's AddPod p50 ÷ the sum of its kernel phases' p50s
	maxE2ERatio    = 1.25 // AddPod end to end p50 ÷ (kernel phases + a gRPC round trip)
	minRate        = 1500 // AddPod/s at rateConc in flight
	rateConc       = scaleConc
	// maxAnonMiB bounds the daemon's anonymous memory (its heap, stacks
	// and caches); VmRSS also counts the executable's mapped pages, which
	// the kernel can drop and share.
	maxAnonMiB = 40
)

var (
	goalKernel = fmt.Sprintf("AddPod in the daemon ≤ %g× the sum of its kernel phases (%s; p50s)", maxKernelRatio, kernelPhasesText())
	goalE2E    = fmt.Sprintf("AddPod end to end ≤ %g× (its kernel phases + a gRPC round trip; p50s)", maxE2ERatio)
	goalRate   = fmt.Sprintf("≥ %s AddPod/s at concurrency %d", thousands(minRate), rateConc)
)

// e2eFloor is what an AddPod over the socket cannot go below: its kernel
// phases plus an empty call's round trip, in ms (0 unless all were timed).
func (r *report) e2eFloor() float64 {
	k, rpc := r.kernelSum(), r.phaseP50(phRPC)
	if k <= 0 || rpc <= 0 {
		return 0
	}
	return k + rpc
}

// thousands prints n with a comma between thousands: 1,500.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// parity is the conn/s ratio that counts as parity. The two rulesets do
// the same work per packet in the same engine (iptables-nft compiles to
// nf_tables), and on a shared machine two samples of one method differ by
// a few percent, so a strict 1.00 would be a coin toss on a true tie.
const parity = 0.98

// leakTolerance is the RSS growth the leak check accepts: the Go heap and
// gRPC's buffers move by up to a MiB between two readings, while a leak of
// 32 bytes per cycle would add 3 MiB over 100,000 cycles.
const leakTolerance = 2 << 20

func (r *report) targetTable() table {
	t := table{title: "Targets", head: []string{"target", "measured", "result"}}
	for _, tg := range r.targets() {
		v := "PASS"
		if !tg.pass {
			v = "MISS"
		}
		t.rows = append(t.rows, []string{tg.goal, tg.measured, v})
	}
	if r.cfg.quick {
		t.notes = []string{"Quick run: a smoke test of the benchmark, not a measurement."}
	}
	return t
}

func (r *report) rawTable() table {
	t := table{
		title: "Every sample",
		head:  []string{"rep", "method", "p50 ms", "p99 ms", "per s", "CPU ms/op", "load"},
	}
	var all []*sample
	for _, ss := range r.res.apply {
		all = append(all, ss...)
	}
	for _, ss := range r.res.dp {
		all = append(all, ss...)
	}
	slices.SortStableFunc(all, func(a, b *sample) int {
		if a.rep != b.rep {
			return a.rep - b.rep
		}
		return strings.Compare(a.method+fmt.Sprint(a.conc), b.method+fmt.Sprint(b.conc))
	})
	for _, s := range all {
		name := s.method
		if s.phases == nil && !strings.HasPrefix(name, "nftredir AddPod") && !strings.HasPrefix(name, "nftredir RemovePod") {
			name = dpKey(s.method, s.conc)
		}
		t.rows = append(t.rows, []string{fmt.Sprint(s.rep + 1), name, fmt.Sprintf("%.3f", s.p50()), fmt.Sprintf("%.3f", s.p99()),
			fmt.Sprintf("%.0f", s.rate()), fmt.Sprintf("%.3f", s.cpuPer()), fmt.Sprintf("%.2f", s.load)})
	}
	return t
}

func (r *report) tables() []table {
	ts, _ := r.sections()
	return ts
}

// sections are the report's tables and their Markdown section names, in
// order; the A/B table is there only in a run that had a baseline build.
func (r *report) sections() ([]table, []string) {
	ts := []table{r.targetTable(), r.applyTable()}
	names := []string{"Targets", "Programming one pod"}
	if r.res.baseline != nil {
		ts, names = append(ts, r.baselineTable()), append(names, baselineSection)
	}
	ts = append(ts, r.baselineSteps(), r.phaseTable(), r.cniTable(), r.scaleTable(), r.resourceTable(), r.dpTable())
	names = append(names, "The baselines' commands", "Where AddPod's time goes", "CNI ADD as the runtime sees it", "Reconcile at scale",
		"Memory and file descriptors", "Data path")
	ps := r.podStartTables()
	return append(ts, ps...), append(names, []string{"Pod start as the kubelet sees it", kubeAddSection}[:len(ps)]...)
}

func (r *report) text() string {
	var sb strings.Builder
	for _, t := range r.tables() {
		sb.WriteString(t.text())
	}
	m := r.res.machine
	fmt.Fprintf(&sb, "\n%s, %d cores, kernel %s, %s; load %.2f at start, %.2f at end; %v in all\n",
		m.cpu, m.cores, m.kernel, m.goVersion, m.loadStart, r.res.loadEnd, r.res.duration.Round(time.Second))
	if b := r.res.baseline; b != nil {
		fmt.Fprintf(&sb, "baseline build: %s: %s\n", b.bin, b.version)
	}
	return sb.String()
}

// write writes the Markdown report to out and the chart to svgPath.
func (r *report) write(out, svgPath string) error {
	if svgPath != "" {
		if err := os.MkdirAll(filepath.Dir(svgPath), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(svgPath, []byte(r.chart()), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(out, []byte(r.markdown(out, svgPath)), 0o644)
}

func (r *report) markdown(out, svgPath string) string {
	m := r.res.machine
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("# Benchmarks\n\n")
	w("<!-- Generated by cmd/nftredir-bench (make bench); edit the program, not this file. -->\n\n")
	seq := r.seqAdd()
	p50 := spreadOf(per(seq, p50Of)).med
	ipt := spreadOf(per(r.res.apply[mIPT], p50Of)).med
	nftc := spreadOf(per(r.res.apply[mNFT], p50Of)).med
	w("nftredir enrols a pod end to end — a gRPC call over the daemon's socket that opens and checks the namespace, writes the durable record, "+
		"installs the ip rule and route and the nft table, adds the pod's address to the node's probe set, and replies — in **%.2f ms** (p50), where loading the peer's iptables ruleset with "+
		"`iptables-restore` plus the same two `ip` commands takes **%.1f ms** (%s) and `nft -f` of the same ruleset **%.1f ms** (%s), "+
		"measured in the same run on the same machine.\n\n",
		p50, ipt, speedText(spreadOf(paired(r.res.apply[mIPT], seq, p50Of))), nftc, speedText(spreadOf(paired(r.res.apply[mNFT], seq, p50Of))))
	w("Latest full run: %s, `%s`, on %s (%d cores), kernel %s. Load average %.2f at the start, before the run's own work (%.2f per core), and %.2f at the end; %v in all.\n\n",
		m.date.Format("2006-01-02 15:04 MST"), r.cmdline(), m.cpu, m.cores, m.kernel, m.loadStart, m.loadStart/float64(max(m.cores, 1)), r.res.loadEnd, r.res.duration.Round(time.Second))
	if r.cfg.quick {
		w("**This is a quick smoke run, not a measurement.**\n\n")
	}
	if svgPath != "" {
		rel, err := filepath.Rel(filepath.Dir(out), svgPath)
		if err != nil {
			rel = svgPath
		}
		w("![Latency distributions: AddPod against iptables-restore and nft -f, and per-connection latency through capture](%s)\n\n", filepath.ToSlash(rel))
	}
	ts, sections := r.sections()
	for i, t := range ts {
		w("## %s\n\n", sections[i])
		if t.title != sections[i] {
			w("%s.\n\n", t.title)
		}
		w("%s\n", t.markdown())
		if sections[i] == "Targets" {
			w("%s\n", r.targetNotes())
		}
		if sections[i] == kubeAddSection {
			w("%s\n", r.podStartNotes())
		}
	}
	w("## Method\n\n")
	w("The baselines are measured the way `research/baseline-bench.md` measured them, and in the same invocation as nftredir:\n\n")
	w("- Every sample creates %d fresh namespaces (`ip netns add`, lo up; untimed), programs one pod per namespace, timing each pod, "+
		"then deletes the namespaces and pauses %v while the kernel tears them down. Each repetition runs every method once, in a rotating order.\n", r.cfg.pods, r.cfg.settle)
	w("- **nftredir**: `nftredird` as built, started with its defaults (JSON logs at info, default capture spec, node probe table on) on a state dir %s, "+
		"except that its node is a namespace this program made (`--node-netns`), so it keeps the probe table and pod address sets there instead of on this machine, "+
		"no ZDS socket is served (no node proxy connects), and the periodic reconcile is moved out of the run. Every pod has its own address. One client (`client.Dial`) calls AddPod (pod uid, netns path, one pod IP) with %s calls in flight, "+
		"then RemovePod for every pod the same way. Each sample's first and last namespace are checked through netlink (table with all %s rules, ip rule, route; and gone after RemovePod).\n",
		r.stateDirText(), concText(r.cfg.conc), r.wantRulesText())
	rt := policyRouting("NS")
	w("- **iptables-restore + 2× ip**: `ip netns exec NS iptables-restore --noflush` (%s) of the peer's in-pod TPROXY ruleset "+
		"(`research/istio.md` §1.4, without its DNS lines and raw table, which nftredir's default spec does not have either, and with the `-m socket --transparent` mark rule "+
		"it needs for connections to addresses the pod does not own, which nftredir's ruleset has), then `%s` and "+
		"`%s`. IPv4 only: an IPv6 pod would also need `ip6tables-restore`. One pod after another, as a script-driven agent does. "+
		"Checked with `iptables-save` (%d rules, %d TPROXY) and netlink.\n", r.iptablesText(), strings.Join(rt[0].args, " "), strings.Join(rt[1].args, " "), peerRules, peerTProxyRules)
	w("- **nft -f + 2× ip**: `ip netns exec NS nft -f -` of nftredir's own ruleset (`nft.Build(nft.DefaultSpec(uid)).String()`, prefixed with " +
		"`table inet nftredir` / `delete table inet nftredir` to make it an atomic replace), then the same two `ip` commands.\n")
	w("- **Reconcile at scale**: %d namespaces are enrolled through AddPod (their records on disk, namespaces programmed); the daemon is stopped with SIGTERM and "+
		"started again; the time runs from just before exec to the moment its grpc.health.v1 Watch says SERVING, which the daemon says only after its startup reconcile. "+
		"Then this program deletes every pod's table through netlink while the daemon is down, and times the restart again. After each restart the daemon's ListPods and "+
		"every namespace's table are checked.\n", r.res.scale.pods)
	if r.res.baseline != nil {
		w("- **Baseline build**: a second nftredird from `-baseline-daemon`, started as the main one but on a state dir and a node namespace of its own, " +
			"measured with the same AddPod and RemovePod samples in the same rotation; see the note under its table.\n")
	}
	w("- **CNI chains**: see the note under their table.\n")
	w("- **Memory and fds**: VmRSS and RssAnon from /proc/PID/status and the entries of /proc/PID/fd, one second after the daemon was last busy; the leak check compares RssAnon.\n")
	w("- **Data path**: see the note under its table.\n")
	if r.res.podStart != nil {
		w("- **Pod start**: see the notes under its tables. The cluster is started once, after the apply, CNI and data path sections and before the reconcile and leak sections (which stop the main daemon); in each of its rounds, after the pods and while the cluster runs, two standalone daemons are timed with sequential AddPods, each after a pause: the main one (default spec) and one started with the Kubernetes-mode daemon's spec (DNS capture, no node probe set), the base of the Kubernetes-mode ratio.\n")
	}
	w("- Statistics: p50/p99 are nearest-rank percentiles over the pods of one sample; every table shows the median over repetitions and the range [min–max]. " +
		"Ratios are computed within each repetition, then summarised.\n\n")
	w("## Machine\n\n")
	w("| | |\n|---|---|\n")
	rows := [][2]string{
		{"date", m.date.Format(time.RFC3339)},
		{"CPU", fmt.Sprintf("%s, %d cores", m.cpu, m.cores)},
		{"memory", m.memory},
		{"kernel", m.kernel},
		{"Go", m.goVersion},
		{"nftredird", "revision " + m.revision},
	}
	if b := r.res.baseline; b != nil {
		rows = append(rows, [2]string{"baseline nftredird", fmt.Sprintf("`%s`: %s", b.bin, b.version)})
	}
	rows = append(rows, [][2]string{
		{"nft", m.nft},
		{"iptables", m.iptables},
		{"iproute2", m.iproute},
		{"load average (1 min)", fmt.Sprintf("%.2f at start, %.2f at end", m.loadStart, r.res.loadEnd)},
	}...)
	for _, row := range rows {
		w("| %s | %s |\n", row[0], row[1])
	}
	w("\n## Reproduce\n\n")
	w("As root, from a checkout:\n\n```sh\nmake bench                  # hack/deps.sh, build, then this run: %s\n"+
		"bin/nftredir-bench -quick   # a smoke run of every part in seconds; prints, writes nothing\n```\n\n", r.cmdline())
	w("Flags: `-pods`, `-reps`, `-reconcile-pods`, `-cycles`, `-conc`, `-dp-conc`, `-dp-duration`, `-dp-conns`, `-cni-pods`, `-only-cni`, `-podstart-rounds`, `-podstart-pods`, `-only-podstart`, `-no-podstart`, `-baseline-daemon`, `-only-baseline`, `-out`, `-svg`, `-quick`; `-h` lists them all. " +
		"Everything the run creates is named `nftr-bench-<pid>-*` (namespaces in /run/netns, a tmpfs in /run) and removed at the end, on error and on Ctrl-C; " +
		"a later run sweeps the leftovers of one that was killed.\n\n")
	raw := r.rawTable()
	w("## Every sample\n\n<details><summary>%d samples</summary>\n\n%s\n</details>\n", len(raw.rows), raw.markdown())
	return sb.String()
}

// kubeAddSection is the section of the daemon's handler in a pod start,
// whose notes explain the pod start targets.
const kubeAddSection = "The daemon's part of a pod start"

// concText lists concurrency levels as prose: "1, 4, 8 or 16".
func concText(cs []int) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprint(c)
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " or " + parts[len(parts)-1]
}

// stateDirText says where the daemon's state dir was.
func (r *report) stateDirText() string {
	if r.cfg.tmpfs {
		return "on tmpfs"
	}
	return "on the root filesystem (-tmpfs=false)"
}

// iptablesText names the iptables the baseline ran, from its --version:
// iptables-nft prints "(nf_tables)", iptables-legacy "(legacy)".
func (r *report) iptablesText() string {
	v := r.res.machine.iptables
	switch {
	case strings.Contains(v, "(nf_tables)"):
		return "iptables-nft, the one installed: " + v
	case v == "":
		return "iptables as installed"
	}
	return "as installed: " + v
}

func (r *report) wantRulesText() string {
	n := 0
	if rs, err := nftScript("x"); err == nil {
		n = strings.Count(rs, "comment \"")
	}
	return fmt.Sprint(n)
}

func (r *report) cmdline() string {
	if len(r.cfg.args) == 0 {
		return "bin/nftredir-bench"
	}
	return "bin/nftredir-bench " + strings.Join(r.cfg.args, " ")
}

// targetNotes explains each missed target from the run's own numbers; the
// phase table has the detail.
func (r *report) targetNotes() string {
	var notes []string
	for _, t := range r.targets() {
		if t.pass {
			continue
		}
		switch t.goal {
		case goalRate:
			notes = append(notes, r.rateNote())
		case goalKernel:
			notes = append(notes, r.kernelNote())
		case goalNRIOut, goalNRIOutHandler, goalNRICaptured, goalCNICaptured, goalKubeAdd:
			notes = append(notes, fmt.Sprintf("- *%s*: see the notes under \"%s\" below.", t.goal, kubeAddSection))
		case goalE2E:
			notes = append(notes, fmt.Sprintf("- *%s*: of it, the nft batch takes %.2f ms, the node probe set %.2f ms, policy routing %.2f ms and a gRPC round trip %.2f ms (p50s, timed one by one).",
				t.goal, r.phaseP50(phApply), r.phaseP50(phProbe), r.phaseP50(phRouting), r.phaseP50(phRPC)))
		default:
			notes = append(notes, fmt.Sprintf("- *%s*: see its section below.", t.goal))
		}
	}
	if len(notes) == 0 {
		return "Every target is met.\n"
	}
	return "Why the missed targets were missed:\n\n" + strings.Join(notes, "\n") + "\n"
}

// rateNote explains a missed throughput target by the CPU an AddPod costs.
func (r *report) rateNote() string {
	cores := float64(r.res.machine.cores)
	cpu := spreadOf(per(r.res.apply[mAdd(rateConc)], cpuOf)).med
	rate := spreadOf(per(r.res.apply[mAdd(rateConc)], rateOf)).med
	most := cores * 1000 / cpu
	note := fmt.Sprintf("- *%s*: at %d in flight an AddPod cost %.2f ms of CPU (daemon plus client), so %d cores allow at most %.0f pods/s, with both busy all the time; "+
		"the target needs %.2f ms or less.", goalRate, rateConc, cpu, r.res.machine.cores, most, cores*1000/minRate)
	if most >= minRate {
		note += fmt.Sprintf(" The run's %.0f pods/s is %.0f%% of that: the cores were idle %.0f%% of the time, between calls and while calls waited for each other.",
			rate, 100*rate/most, 100*(1-rate/most))
	}
	if few, many := r.phaseP50(phProbe), r.phaseP50(probeAt(phProbe, r.cfg.reconcilePods)); few > 0 && many > 0 {
		note += fmt.Sprintf(" For comparison, the node probe set's update takes %.2f ms with a few pods in it and %.2f ms with %d (p50s, wall time, timed one by one).",
			few, many, r.cfg.reconcilePods)
	}
	return note
}

// kernelNote explains a daemon AddPod that costs more than the target
// allows over its kernel phases: what the rest of its time is, and the
// other steps that make it up.
func (r *report) kernelNote() string {
	k := r.kernelSum()
	in := spreadOf(per(r.seqAdd(), inDaemonP50)).med
	return fmt.Sprintf("- *%s*: inside the daemon a sequential AddPod takes %.3f ms at p50, of which its kernel phases account for %.3f ms "+
		"(ip rule + route %.3f, nft table %.3f, node probe set %.3f ms); the other %.3f ms is more than the %.3f ms (%.2f× the kernel phases) the target leaves. "+
		"Its other steps, timed one by one: open + check netns %.3f ms, build %.3f ms, read record %.3f ms, write record %.3f ms (p50s).",
		goalKernel, in, k, r.phaseP50(phRouting), r.phaseP50(phApply), r.phaseP50(phProbe), in-k, (maxKernelRatio-1)*k, maxKernelRatio-1,
		r.phaseP50(phOpen), r.phaseP50(phBuild), r.phaseP50(phGet), r.phaseP50(phPut))
}
