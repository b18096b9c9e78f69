package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/signtest"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/nft"
)

// The pod start section's tables, targets and notes.

func (r *report) podStartTables() []table {
	ps := r.res.podStart
	if ps == nil {
		return nil
	}
	return []table{r.podStartTable(), r.kubeAddTable()}
}

func msCell(v float64, prec int) string {
	if v == 0 || math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// pooledCell is a figure over every round, with the range of the
// same figure taken round by round.
func pooledCell(v float64, rounds spread, format string) string {
	if math.IsNaN(v) {
		return "–"
	}
	if rounds.n > 1 {
		return fmt.Sprintf(format+" [%s – %s]", v, fmt.Sprintf(format, rounds.lo), fmt.Sprintf(format, rounds.hi))
	}
	return fmt.Sprintf(format, v)
}

// signCell is how a variant's per-round differences fall, and the sign
// test's chance of that split between equals.
func signCell(s signs) string {
	if s.rounds() == 0 {
		return "–"
	}
	return fmt.Sprintf("%d / %d (%.2g)", s.above, s.below, s.chance)
}

func (r *report) podStartTable() table {
	ps := r.res.podStart
	t := table{
		title: fmt.Sprintf("Pod start as the kubelet sees it: %d rounds of %d pods per variant, each pod alone on the node, in one cluster; differences and ratios to %s are of the p50s over all rounds, [the range of the same taken round by round]", ps.rounds, ps.perRound, psBare),
		head: []string{"variant", "pods", "RunPodSandbox p50 ms", "− " + psBare + " ms", "rounds above / below (sign test)", "÷ " + psBare,
			"its CNI ADD p50 ms", "− " + psBare + " ms", "the rest − " + psBare + " ms", "create→Ready p50 ms", "− " + psBare + " ms", "the daemon's handler p50 ms"},
	}
	for _, v := range psVariants {
		sb, cni, rd := ps.durations(v, -1, mSandbox), ps.durations(v, -1, mCNI), ps.durations(v, -1, mReady)
		row := []string{v, fmt.Sprint(len(sb)), msCell(p50ms(sb), 1)}
		vs := func(m psMetric, ratio bool, format string) string {
			return pooledCell(ps.pooledVs(v, m, ratio), spreadOf(ps.perRoundVs(v, m, ratio)), format)
		}
		if v == psBare {
			row = append(row, "", "", "1.000×", msCell(p50ms(cni), 1), "", "", msCell(p50ms(rd), 1), "", "–")
		} else {
			row = append(row, vs(mSandbox, false, "%+.1f"), signCell(ps.signsVs(v, mSandbox)), vs(mSandbox, true, "%.3f×"),
				msCell(p50ms(cni), 1), vs(mCNI, false, "%+.1f"), vs(mRest, false, "%+.1f"),
				msCell(p50ms(rd), 1), vs(mReady, false, "%+.1f"), msCell(totalP50(ps.kube[v]), 3))
		}
		t.rows = append(t.rows, row)
	}
	t.notes = []string{fmt.Sprintf("The cluster is the project's own (internal/kcluster: Kubernetes %s, containerd with its NRI on and no validator, runc, bridge + host-local; up in %.1f s). "+
		"RunPodSandbox is containerd's, from its log (\"RunPodSandbox for ...\" to \"... returns sandbox id\"): the pod's network namespace, the whole CNI chain, the pause container and the NRI hook, "+
		"as the kubelet waits for it; its CNI ADD is containerd's own timing of the chain within it (its debug lines \"begin cni setup\" to \"cni result\"), the only part of the sandbox that nftredir-cni is in, "+
		"and the rest is RunPodSandbox outside the chain (the pause container through runc and its shim, and the NRI hook, where nftredird enrols under NRI), most of the noise. create→Ready runs from this program's Create call to the watch event that shows the pod Ready (no readiness probe: Ready once its container runs). "+
		"The daemon's handler is its own time for the pod, from its log: under NRI the RunPodSandbox handler's, in process; under CNI the AddPod nftredir-cni calls over the socket (grpc.time_ms). "+
		"Rounds above / below: in how many rounds the variant's p50 was above and below %s's of the same round, and the chance that two variants with no difference split at least that unevenly (the two-sided sign test; below %.2g it is resolved). "+
		"nftredird runs in Kubernetes mode as a host process in the node's namespace (JSON logs at info, admin kubeconfig); its node proxy is %s. "+
		"Pods outside the mesh are in a namespace without the `%s` label, captured ones in a namespace with it. "+
		"Each pod starts alone on the node: it is created, Ready, deleted (grace 0) and its sandbox stopped, then after %s the next starts. "+
		"A daemon registered with the runtime's NRI hears of every sandbox on the node, so each round has two halves, one per enrolment mode, with the daemon restarted between them, %s after it is up with its node proxy connected (%s); "+
		"the halves, and the blocks of a half, alternate which goes first from round to round; each block begins with an untimed pod outside the mesh on the block's chain, after the conflist is switched to it where it changes (and containerd seen to load it), so that no timed pod is the first after a restart or a reload; within a block the variants take turns pod by pod. "+
		"The containerd validator that NRI enrolment relies on in production (docs/nri.md) is off for every variant here, so that *%s* has nothing of nftredir on its path; it acts at CreateContainer, outside RunPodSandbox. "+
		"create→Ready is dominated by the kubelet's pod status cycle (about a second), so only RunPodSandbox resolves milliseconds.",
		kcluster.KubeVersion, ps.clusterUp.Seconds(), psBare, signtest.Significance, ps.proxy, kube.DefaultModeLabel+"="+kube.DefaultModeEnabled, podGap,
		psSettle, halvesText(), psBare)}
	return t
}

// halvesText says which variants run in which enrolment mode, on which
// chain.
func halvesText() string {
	var parts []string
	for _, h := range psHalves {
		var blocks []string
		for _, b := range h.blocks {
			chain := "the bare chain"
			if b.plugin {
				chain = "nftredir-cni chained"
			}
			var names []string
			for _, v := range b.variants {
				names = append(names, "*"+v+"*")
			}
			blocks = append(blocks, fmt.Sprintf("%s on %s", strings.Join(names, " and "), chain))
		}
		parts = append(parts, fmt.Sprintf("--enrolment %s: %s", h.enrolment, strings.Join(blocks, ", then ")))
	}
	return strings.Join(parts, "; ")
}

func (r *report) kubeAddTable() table {
	ps := r.res.podStart
	out, nriCap, cni := ps.kube[psNRIOut], ps.kube[psNRI], ps.kube[psCNI]
	t := table{
		title: "The daemon's handler of a pod start, standalone and in Kubernetes mode, phase by phase (p50 ms of each phase over the calls, from the daemon's log)",
		head:  []string{"phase", "what it covers", "standalone AddPod, default spec", "standalone AddPod, Kubernetes mode's spec", psNRIOut, psNRI, psCNI},
	}
	cols := [][]callLine{ps.alone, ps.same, out, nriCap, cni}
	row := func(name, what string, f func([]callLine) string) {
		cells := []string{name, what}
		for _, c := range cols {
			cells = append(cells, f(c))
		}
		t.rows = append(t.rows, cells)
	}
	for _, ph := range phaseOrder(cols...) {
		row(ph, phaseText[ph], func(ls []callLine) string { return msCell(phaseP50(ls, ph), 3) })
	}
	row("**the handler in the daemon**", "AddPod: grpc.time_ms, first interceptor to the handler's return; NRI: RunPodSandbox, the handler's entry to its return",
		func(ls []callLine) string { return msCell(totalP50(ls), 3) })
	t.rows = append(t.rows,
		[]string{"AddPod end to end", "as its caller saw it: this program (standalone), nftredir-cni (CNI); none under NRI, in process", msCell(p50ms(ps.aloneE2), 3), msCell(p50ms(ps.sameE2), 3), "", "", msCell(pluginP50(ps.plugin, true, false), 3)},
		[]string{"nftredir-cni's run", "from its Go code's start to the daemon's answer", "", "", "", "", msCell(pluginP50(ps.plugin, true, true), 3)},
		[]string{"nftredir-cni's bare exec", "CNI_COMMAND=VERSION, exec to exit", "", "", "", "", msCell(p50ms(ps.versionExec), 3)},
	)
	if len(ps.goExec) > 0 {
		t.rows = append(t.rows, []string{"a minimal Go program's exec", "pause -v, exec to exit, turn about with the row above", "", "", "", "", msCell(p50ms(ps.goExec), 3)})
	}
	if len(ps.anyExec) > 0 {
		t.rows = append(t.rows, []string{"the smallest program's exec", "true(1), a C program, exec to exit, turn about with the rows above", "", "", "", "", msCell(p50ms(ps.anyExec), 3)})
	}
	if len(ps.baselineExec) > 0 {
		t.rows = append(t.rows, []string{"baseline nftredir-cni's bare exec", "-baseline-cni, turn about with the rows above", "", "", "", "", msCell(p50ms(ps.baselineExec), 3)})
	}
	t.notes = []string{fmt.Sprintf("Calls: %d and %d standalone (sequential, through this program's client, %d per daemon and round while the cluster ran, each after a %s pause so that it finds the daemon idle as a pod start's call does); in Kubernetes mode %d, %d and %d, as the kubelet started the pods. "+
		"What each column programs: *standalone, default spec* is the benchmark's main daemon (its defaults with --probe-snat=true): %d rules, no DNS capture, and each pod's address added to the node probe set; "+
		"*standalone, Kubernetes mode's spec* is a second standalone daemon started with `%s`: %d rules with DNS capture (Kubernetes mode's default, as Istio's), no node probe set, as the Kubernetes-mode daemon here (no --probe-snat, no --kubelet-uid) programs a pod without annotations; "+
		"the captured pods in Kubernetes mode get those %d rules and are handed to the node proxy (ZDS). The standalone pods' namespaces hold lo alone, the cluster's also the pod's veth. "+
		"Each phase ends where the daemon marks it (internal/calltrace) and its p50 is taken alone, so the phases' p50s need not add up to the call's. "+
		"The annotation patch (`ambient.istio.io/redirection`) is not on the pod's path: the agent writes it from its queue once the proxy acked the pod.",
		len(ps.alone), len(ps.same), 2*ps.perRound, aloneGap, len(out), len(nriCap), len(cni),
		specRules(false), strings.Join(sameSpecFlags, " "), specRules(defaults.KubernetesCaptureDNS), specRules(defaults.KubernetesCaptureDNS))}
	return t
}

// specRules is the number of rules of the default spec, with or without
// DNS capture.
func specRules(dns bool) int {
	s := nft.DefaultSpec("bench")
	s.CaptureDNS = dns
	rs, err := nft.Build(s)
	if err != nil {
		return -1
	}
	n := 0
	for _, ch := range rs.Chains {
		n += len(ch.Rules)
	}
	return n
}

// pluginP50 is the p50 of nftredir-cni's AddPod call (or of its run).
func pluginP50(lines []pluginLine, captured, run bool) float64 {
	var ds []time.Duration
	for _, l := range lines {
		if l.captured != captured {
			continue
		}
		v := l.call
		if run {
			v = l.run
		}
		ds = append(ds, time.Duration(v*float64(time.Millisecond)))
	}
	return p50ms(ds)
}

// kernelP50 is the p50 of a captured pod's kernel phases in the daemon's
// handler: policy routing and the table, and the node probe set where
// the daemon keeps one.
func kernelP50(lines []callLine) float64 {
	return phaseP50(lines, "kernel") + phaseP50(lines, "probe")
}

func (r *report) podStartTargets() []target {
	ps := r.res.podStart
	if ps == nil {
		return nil
	}
	// Against a standalone daemon that programs the same ruleset,
	// timed beside the cluster: the ratio is Kubernetes mode's cost, not
	// that of DNS capture. The default spec's ratios (beside the
	// cluster and, in a full run, the apply section's sequential AddPod)
	// are shown, not judged: they compare different rulesets.
	kubeAdd := totalP50(ps.kube[psCNI])
	kr := kubeAdd / totalP50(ps.same)
	krText := fmt.Sprintf("%.3f× = %.3f ms ÷ %.3f ms (standalone with Kubernetes mode's spec, beside the cluster); against the default spec: %.3f× beside the cluster",
		kr, kubeAdd, totalP50(ps.same), kubeAdd/totalP50(ps.alone))
	if seq := r.seqAdd(); len(seq) > 0 {
		base := spreadOf(per(seq, inDaemonP50)).med
		if q := kubeAdd / base; !math.IsNaN(q) {
			krText += fmt.Sprintf(", %.3f× against the apply section's sequential AddPod in the daemon (%.3f ms)", q, base)
		}
	}
	out := ps.signsVs(psNRIOut, mSandbox)
	outHandler := totalP50(ps.kube[psNRIOut])
	kernel := kernelP50(ps.kube[psNRI])
	nriExtra := ps.pooledVs(psNRI, mSandbox, false)
	return []target{
		{goalNRIOut, fmt.Sprintf("%s; %s", ps.sandboxVsText(psNRIOut, false), signText(out)),
			len(ps.perRoundVs(psNRIOut, mSandbox, false)) >= minSignRounds && !out.resolved()},
		{goalNRIOutHandler, fmt.Sprintf("%.3f ms (%s)", outHandler, topPhases(ps.kube[psNRIOut], 3)), outHandler > 0 && outHandler <= maxNRIOutHandlerM},
		{goalNRICaptured, fmt.Sprintf("%s, allowed +%.2f ms = %.2f (its kernel phases, p50) + %g", ps.sandboxVsText(psNRI, false), kernel+maxNRIExtraMS, kernel, maxNRIExtraMS),
			kernel > 0 && nriExtra <= kernel+maxNRIExtraMS},
		{goalCNICaptured, ps.sandboxVsText(psCNI, true), ps.pooledVs(psCNI, mSandbox, false) <= maxCNIExtraMS},
		{goalKubeAdd, krText, kr <= maxKubeAddRatio},
	}
}

// signText words a sign test's outcome.
func signText(s signs) string {
	verdict := "not resolved"
	if s.resolved() {
		verdict = "resolved"
	}
	return fmt.Sprintf("above in %d of %d rounds, below in %d: a split two equal variants show with chance %.2g, %s", s.above, s.rounds(), s.below, s.chance, verdict)
}

// sandboxVsText is a variant's RunPodSandbox over the bare variant's,
// with, for a variant with nftredir-cni, the part of it in the CNI chain
// and the rest.
func (ps *podStartResult) sandboxVsText(v string, chain bool) string {
	vs := func(m psMetric) string {
		return pooledCell(ps.pooledVs(v, m, false), spreadOf(ps.perRoundVs(v, m, false)), "%+.1f")
	}
	s := fmt.Sprintf("%s ms (%.1f vs %.1f ms)", vs(mSandbox), p50ms(ps.durations(v, -1, mSandbox)), p50ms(ps.durations(psBare, -1, mSandbox)))
	if chain {
		s += fmt.Sprintf("; its CNI ADD %s ms (%.1f vs %.1f ms), the rest %s ms",
			vs(mCNI), p50ms(ps.durations(v, -1, mCNI)), p50ms(ps.durations(psBare, -1, mCNI)), vs(mRest))
	}
	return s
}

// podStartNotes explains the section's figures from the run: what the
// daemon's handler accounts for in each variant's extra sandbox time,
// the plugin's exec and call under CNI, and which phases make Kubernetes
// mode's AddPod longer.
func (r *report) podStartNotes() string {
	ps := r.res.podStart
	if ps == nil {
		return ""
	}
	var notes []string
	for _, v := range []string{psNRIOut, psNRI} {
		extra := ps.pooledVs(v, mSandbox, false)
		lines := ps.kube[v]
		in := totalP50(lines)
		n := fmt.Sprintf("- *%s*: the sandbox takes %+.1f ms over %s's (p50s over all rounds; %s). "+
			"The daemon's RunPodSandbox handler, inside it, takes %.3f ms (p50; %s)", v, extra, psBare, signText(ps.signsVs(v, mSandbox)), in, topPhases(lines, 3))
		if v == psNRI {
			k := kernelP50(lines)
			n += fmt.Sprintf(", of which the kernel's work %.3f ms, which must be done before the answer for the pod never to run uncaptured; the target allows it + %g ms, %+.2f ms to spare",
				k, maxNRIExtraMS, k+maxNRIExtraMS-extra)
		}
		n += fmt.Sprintf(". The rest of the difference, %+.1f ms, is outside the handler: the runtime's NRI round trip, the daemon and %s sharing %d cores with the sandbox's other work, and the run's noise (below).",
			extra-in, proxyName(ps), r.res.machine.cores)
		notes = append(notes, n)
	}
	{
		extra, chain, outside := ps.pooledVs(psCNI, mSandbox, false), ps.pooledVs(psCNI, mCNI, false), ps.pooledVs(psCNI, mRest, false)
		exec := p50ms(ps.versionExec)
		run, call := pluginP50(ps.plugin, true, true), pluginP50(ps.plugin, true, false)
		lines := ps.kube[psCNI]
		notes = append(notes, fmt.Sprintf("- *%s*: the sandbox takes %+.1f ms over %s's (p50s over all rounds; %s): its CNI ADD %+.1f ms, the rest %+.1f ms. "+
			"nftredir-cni accounts for about %.1f ms of the CNI ADD's: a bare exec of it takes %.2f ms (its start-up and exit), and its run from its Go code's start to the daemon's answer %.2f ms, of which the AddPod call %.2f ms, "+
			"%.2f ms of that in the daemon (%s). The other %+.1f ms of the CNI ADD is outside the plugin's own timings: its exit after the answer, the runtime's handling of one more plugin, and the chain's other plugins sharing %d cores with nftredir's work%s.",
			psCNI, extra, psBare, signText(ps.signsVs(psCNI, mSandbox)), chain, outside, exec+run, exec, run, call, totalP50(lines), topPhases(lines, 3), chain-exec-run, r.res.machine.cores, proxyNote(ps)))
	}
	var cpuParts []string
	for _, v := range psVariants {
		cpuParts = append(cpuParts, fmt.Sprintf("%.1f and %.1f ms (*%s*)", ps.cpuP50(v, false, true), ps.cpuP50(v, false, false), v))
	}
	proxyCPU := "the stand-in proxy runs inside this program and is not measured"
	if strings.HasPrefix(ps.proxy, "ztunnel") {
		var parts []string
		for _, v := range psVariants {
			parts = append(parts, fmt.Sprintf("%.1f and %.1f ms (*%s*)", ps.cpuP50(v, true, true), ps.cpuP50(v, true, false), v))
		}
		proxyCPU = "ztunnel " + strings.Join(parts, ", ")
	}
	notes = append(notes, fmt.Sprintf("- *CPU beside the sandbox* (p50s per pod, during its RunPodSandbox and from its Create call until it was Ready; each process's CPU clock, sampled every %s): "+
		"nftredird in Kubernetes mode %s; %s. CPU they use while the sandbox is made is taken from containerd, the chain and runc on %d cores.",
		cpuSampleEvery, strings.Join(cpuParts, ", "), proxyCPU, r.res.machine.cores))
	bare := func(m psMetric) spread {
		var v []float64
		for round := range ps.rounds {
			if d := ps.durations(psBare, round, m); len(d) > 0 {
				v = append(v, p50ms(d))
			}
		}
		return spreadOf(v)
	}
	sb, chain := bare(mSandbox), bare(mCNI)
	notes = append(notes, fmt.Sprintf("- *The run's noise*: %s's p50 ranged from round to round (%d pods a round) %.1f–%.1f ms for RunPodSandbox and %.1f–%.1f ms for its CNI ADD, on a machine whose load average went %s; "+
		"a difference smaller than its measure's range is resolved, if at all, only by the sign test over the rounds. The daemon was restarted %s between halves, each time serving again with its node proxy connected %.1f s (p50) after it was stopped.",
		psBare, ps.perRound, sb.lo, sb.hi, chain.lo, chain.hi, loadText(ps.load), timesText(len(ps.restarts)), p50ms(ps.restarts)/1000))
	if n := floorNote(ps); n != "" {
		notes = append(notes, n)
	}
	same, alone, kubeAdd := totalP50(ps.same), totalP50(ps.alone), totalP50(ps.kube[psCNI])
	notes = append(notes, fmt.Sprintf("- *AddPod in Kubernetes mode* (CNI, captured): %.3f ms against %.3f ms standalone with the same ruleset (%.2f×); the phases Kubernetes mode adds or makes longer: %s. "+
		"Against the default spec's standalone AddPod (%.3f ms, %d rules instead of %d, plus the node probe set) it is %.2f×. Under NRI the same AddPod, in process, takes %.3f ms.",
		kubeAdd, same, kubeAdd/same, extraPhases(ps.same, ps.kube[psCNI]),
		alone, specRules(false), specRules(defaults.KubernetesCaptureDNS), kubeAdd/alone, totalP50(ps.kube[psNRI])))
	return "Where a pod's start goes, from this run's figures:\n\n" + strings.Join(notes, "\n") + "\n"
}

// timesText says how often: once, twice, 3 times.
func timesText(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}

func proxyName(ps *podStartResult) string {
	if strings.HasPrefix(ps.proxy, "ztunnel") {
		return "ztunnel"
	}
	return "the stand-in proxy"
}

func proxyNote(ps *podStartResult) string {
	if strings.HasPrefix(ps.proxy, "ztunnel") {
		return " and with ztunnel taking the pod (it enters the pod's namespace and opens its listeners)"
	}
	return ""
}

// topPhases names the n longest phases of lines by p50.
func topPhases(lines []callLine, n int) string {
	type ph struct {
		name string
		ms   float64
	}
	var all []ph
	for _, name := range phaseOrder(lines) {
		all = append(all, ph{name, phaseP50(lines, name)})
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[j].ms > all[i].ms {
				all[i], all[j] = all[j], all[i]
			}
		}
	}
	var parts []string
	for i := 0; i < len(all) && i < n; i++ {
		parts = append(parts, fmt.Sprintf("%s %.3f", all[i].name, all[i].ms))
	}
	return "longest phases: " + strings.Join(parts, ", ") + " ms"
}

// extraPhases lists the phases whose p50 in kube exceeds alone's, largest
// first.
func extraPhases(alone, kube []callLine) string {
	type ph struct {
		name  string
		a, k  float64
		delta float64
	}
	var all []ph
	for _, name := range phaseOrder(alone, kube) {
		a, k := phaseP50(alone, name), phaseP50(kube, name)
		if k-a > 0.005 {
			all = append(all, ph{name, a, k, k - a})
		}
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[j].delta > all[i].delta {
				all[i], all[j] = all[j], all[i]
			}
		}
	}
	if len(all) == 0 {
		return "none"
	}
	var parts []string
	for _, p := range all {
		parts = append(parts, fmt.Sprintf("%s %.3f ms (standalone %.3f)", p.name, p.k, p.a))
	}
	return strings.Join(parts, ", ")
}

func loadText(l []float64) string {
	if len(l) == 0 {
		return "unrecorded"
	}
	lo, hi := l[0], l[0]
	for _, v := range l {
		lo, hi = min(lo, v), max(hi, v)
	}
	return fmt.Sprintf("from %.2f to %.2f over the rounds", lo, hi)
}

// floorNote sets the CNI target beside what no Go plugin can skip: its
// own exec, and the kernel's work, which must be done before the plugin
// answers for the pod never to run uncaptured. Where the run timed
// true(1), it also says whether a plugin in another language could meet
// a target that no Go plugin meets. Under NRI there is no exec: the
// floor is the runtime's call into the daemon.
func floorNote(ps *podStartResult) string {
	if len(ps.goExec) == 0 {
		return ""
	}
	goExec, plugin := p50ms(ps.goExec), p50ms(ps.versionExec)
	anyExec := math.NaN()
	if len(ps.anyExec) > 0 {
		anyExec = p50ms(ps.anyExec)
	}
	kernel := kernelP50(ps.kube[psCNI])
	target := maxCNIExtraMS
	var judged string
	switch goFloor, anyFloor := goExec+kernel, anyExec+kernel; {
	case goFloor <= target:
		judged = fmt.Sprintf("%.1f ms under the target of +%.0f ms", target-goFloor, target)
	case anyFloor > target:
		judged = fmt.Sprintf("%.1f ms above the target of +%.0f ms, which no plugin meets on this machine, in Go or any other language (true(1) and the kernel's work: +%.2f ms)", goFloor-target, target, anyFloor)
	case math.IsNaN(anyFloor):
		judged = fmt.Sprintf("%.1f ms above the target of +%.0f ms, which no Go plugin meets on this machine", goFloor-target, target)
	default:
		judged = fmt.Sprintf("%.1f ms above the target of +%.0f ms, which no Go plugin meets on this machine (true(1), a C program, would leave %.2f ms)", goFloor-target, target, target-anyFloor)
	}
	baseline := ""
	if len(ps.baselineExec) > 0 {
		b := p50ms(ps.baselineExec)
		than := "shorter"
		if plugin > b {
			than = "longer"
		}
		baseline = fmt.Sprintf("; the baseline build's, -baseline-cni %s, %.2f ms, %+.2f ms more than the smallest Go program, so this build's start-up is %.2f ms %s", ps.baselineCNI, b, b-goExec, math.Abs(b-plugin), than)
	}
	anyText := ""
	if !math.IsNaN(anyExec) {
		anyText = fmt.Sprintf(", and the smallest program of all, true(1), %.2f ms", anyExec)
	}
	return fmt.Sprintf("- *The floor under CNI*: the smallest Go program, started and exited, takes %.2f ms here (nftredir-cni's own bare exec %.2f ms, %+.2f ms more%s%s; all timed turn about, %d times each). "+
		"Every pod pays that in CNI mode, in or out of the mesh; a captured one also waits for the kernel's work (%.2f ms p50), done before the answer so that the pod never runs uncaptured: "+
		"+%.2f ms, %s. Under NRI no program is started: a pod outside the mesh pays the runtime's call into the daemon and the handler's %.3f ms.",
		goExec, plugin, plugin-goExec, baseline, anyText, len(ps.goExec), kernel, goExec+kernel, judged, totalP50(ps.kube[psNRIOut]))
}
