package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
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

func (r *report) podStartTable() table {
	ps := r.res.podStart
	t := table{
		title: fmt.Sprintf("Pod start as the kubelet sees it: %d rounds of %d pods per variant, each pod alone on the node, in one cluster; differences and ratios to the bare chain are of the p50s over all rounds, [the range of the same taken round by round]", ps.rounds, ps.perRound),
		head:  []string{"chain", "pods", "RunPodSandbox p50 ms", "− bare ms", "÷ bare", "its CNI ADD p50 ms", "− bare ms", "the rest − bare ms", "create→Ready p50 ms", "− bare ms"},
	}
	for _, v := range psVariants {
		sb, cni, rd := ps.durations(v, -1, mSandbox), ps.durations(v, -1, mCNI), ps.durations(v, -1, mReady)
		row := []string{v, fmt.Sprint(len(sb)), msCell(p50ms(sb), 1)}
		vs := func(m psMetric, ratio bool, format string) string {
			return pooledCell(ps.pooledVs(v, m, ratio), spreadOf(ps.perRoundVs(v, m, ratio)), format)
		}
		if v == psBare {
			row = append(row, "", "1.000×", msCell(p50ms(cni), 1), "", "", msCell(p50ms(rd), 1), "")
		} else {
			row = append(row, vs(mSandbox, false, "%+.1f"), vs(mSandbox, true, "%.3f×"),
				msCell(p50ms(cni), 1), vs(mCNI, false, "%+.1f"), vs(mRest, false, "%+.1f"),
				msCell(p50ms(rd), 1), vs(mReady, false, "%+.1f"))
		}
		t.rows = append(t.rows, row)
	}
	t.notes = []string{fmt.Sprintf("The cluster is the project's own (internal/kcluster: kubelet %s, containerd, runc, bridge + host-local; up in %.1f s). "+
		"RunPodSandbox is containerd's, from its log (\"RunPodSandbox for ...\" to \"... returns sandbox id\"): the pod's network namespace and the whole CNI chain, "+
		"as the kubelet waits for it; its CNI ADD is containerd's own timing of the chain within it (its debug lines \"begin cni setup\" to \"cni result\"), the only part of the sandbox that nftredir-cni is in, "+
		"and the rest is RunPodSandbox outside the chain (the pause container through runc and its shim), the same work for every variant and most of the noise. create→Ready runs from this program's Create call to the watch event that shows the pod Ready (no readiness probe: Ready once its container runs). "+
		"nftredird runs in Kubernetes mode as a host process in the node's namespace (JSON logs at info, admin kubeconfig); its node proxy is %s. "+
		"Pods outside the mesh are in a namespace without the `%s` label, captured ones in a namespace with it. "+
		"Each pod starts alone on the node: it is created, Ready, deleted (grace 0) and its sandbox stopped (CNI DEL done), then after %s the next starts; the three variants take turns in every order, each going first and following each other one as often as the others, and the conflist is switched (and containerd seen to load it) between the bare chain and nftredir's. "+
		"create→Ready is dominated by the kubelet's pod status cycle (about a second), so only RunPodSandbox resolves milliseconds.",
		kcluster.KubeVersion, ps.clusterUp.Seconds(), ps.proxy, kube.DefaultModeLabel+"="+kube.DefaultModeEnabled, podGap)}
	return t
}

func (r *report) kubeAddTable() table {
	ps := r.res.podStart
	out, capd := ps.kube[psOut], ps.kube[psCaptured]
	t := table{
		title: "AddPod in the daemon, standalone and in Kubernetes mode, phase by phase (p50 ms of each phase over the calls, from the daemon's request log)",
		head:  []string{"phase", "what it covers", "standalone, default spec", "standalone, Kubernetes mode's spec", "Kubernetes mode, not captured", "Kubernetes mode, captured"},
	}
	for _, ph := range phaseOrder(ps.alone, ps.same, out, capd) {
		t.rows = append(t.rows, []string{ph, phaseText[ph], msCell(phaseP50(ps.alone, ph), 3), msCell(phaseP50(ps.same, ph), 3), msCell(phaseP50(out, ph), 3), msCell(phaseP50(capd, ph), 3)})
	}
	t.rows = append(t.rows,
		[]string{"**AddPod in the daemon**", "grpc.time_ms, first interceptor to the handler's return", msCell(totalP50(ps.alone), 3), msCell(totalP50(ps.same), 3), msCell(totalP50(out), 3), msCell(totalP50(capd), 3)},
		[]string{"AddPod end to end", "as its caller saw it: this program (standalone), nftredir-cni (Kubernetes mode)", msCell(p50ms(ps.aloneE2), 3), msCell(p50ms(ps.sameE2), 3), msCell(pluginP50(ps.plugin, false, false), 3), msCell(pluginP50(ps.plugin, true, false), 3)},
		[]string{"nftredir-cni's run", "from its Go code's start to the daemon's answer", "", "", msCell(pluginP50(ps.plugin, false, true), 3), msCell(pluginP50(ps.plugin, true, true), 3)},
		[]string{"nftredir-cni's bare exec", "CNI_COMMAND=VERSION, exec to exit", "", "", msCell(p50ms(ps.versionExec), 3), msCell(p50ms(ps.versionExec), 3)},
	)
	if len(ps.goExec) > 0 {
		t.rows = append(t.rows, []string{"a minimal Go program's exec", "pause -v, exec to exit, turn about with the row above", "", "", msCell(p50ms(ps.goExec), 3), msCell(p50ms(ps.goExec), 3)})
	}
	if len(ps.anyExec) > 0 {
		t.rows = append(t.rows, []string{"the smallest program's exec", "true(1), a C program, exec to exit, turn about with the rows above", "", "", msCell(p50ms(ps.anyExec), 3), msCell(p50ms(ps.anyExec), 3)})
	}
	if len(ps.baselineExec) > 0 {
		t.rows = append(t.rows, []string{"baseline nftredir-cni's bare exec", "-baseline-cni, turn about with the rows above", "", "", msCell(p50ms(ps.baselineExec), 3), msCell(p50ms(ps.baselineExec), 3)})
	}
	t.notes = []string{fmt.Sprintf("Calls: %d and %d standalone (sequential, through this program's client, %d per daemon and round while the cluster ran, each after a %s pause so that it finds the daemon idle as a pod start's call does), %d not captured and %d captured in Kubernetes mode (through nftredir-cni, as the kubelet started the pods). "+
		"What each column programs: *standalone, default spec* is the benchmark's main daemon (its defaults with --probe-snat=true): %d rules, no DNS capture, and each pod's address added to the node probe set; "+
		"*standalone, Kubernetes mode's spec* is a second standalone daemon started with `%s`: %d rules with DNS capture (Kubernetes mode's default, as Istio's), no node probe set, as the Kubernetes-mode daemon here (no --probe-snat, no --kubelet-uid) programs a pod without annotations; "+
		"*Kubernetes mode, captured* programs those %d rules and hands the pod to the node proxy (ZDS). The standalone pods' namespaces hold lo alone, the cluster's also the pod's veth. "+
		"Each phase ends where the daemon marks it (internal/calltrace) and its p50 is taken alone, so the phases' p50s need not add up to the call's. "+
		"The annotation patch (`ambient.istio.io/redirection`) is not on the AddPod path: the agent writes it from its queue once the proxy acked the pod.",
		len(ps.alone), len(ps.same), 2*ps.perRound, aloneGap, len(out), len(capd),
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

func (r *report) podStartTargets() []target {
	ps := r.res.podStart
	if ps == nil {
		return nil
	}
	capd, out := ps.pooledVs(psCaptured, mSandbox, false), ps.pooledVs(psOut, mSandbox, false)
	// Against a standalone daemon that programs the same ruleset,
	// timed beside the cluster: the ratio is Kubernetes mode's cost, not
	// that of DNS capture. The default spec's ratios (beside the
	// cluster and, in a full run, the apply section's sequential AddPod)
	// are shown, not judged: they compare different rulesets.
	kube := totalP50(ps.kube[psCaptured])
	kr := kube / totalP50(ps.same)
	krText := fmt.Sprintf("%.3f× = %.3f ms ÷ %.3f ms (standalone with Kubernetes mode's spec, beside the cluster); against the default spec: %.3f× beside the cluster",
		kr, kube, totalP50(ps.same), kube/totalP50(ps.alone))
	if seq := r.seqAdd(); len(seq) > 0 {
		base := spreadOf(per(seq, inDaemonP50)).med
		if q := kube / base; !math.IsNaN(q) {
			krText += fmt.Sprintf(", %.3f× against the apply section's sequential AddPod in the daemon (%.3f ms)", q, base)
		}
	}
	return []target{
		{goalPSCaptured, ps.sandboxVsText(psCaptured), capd <= maxCapturedExtraMS},
		{goalPSOut, ps.sandboxVsText(psOut), out <= maxOutExtraMS},
		{goalKubeAdd, krText, kr <= maxKubeAddRatio},
	}
}

// sandboxVsText is a variant's RunPodSandbox over the bare chain's, with
// the part of it in the CNI chain and the rest.
func (ps *podStartResult) sandboxVsText(v string) string {
	vs := func(m psMetric) string {
		return pooledCell(ps.pooledVs(v, m, false), spreadOf(ps.perRoundVs(v, m, false)), "%+.1f")
	}
	return fmt.Sprintf("%s ms (%.1f vs %.1f ms); its CNI ADD %s ms (%.1f vs %.1f ms), the rest %s ms",
		vs(mSandbox), p50ms(ps.durations(v, -1, mSandbox)), p50ms(ps.durations(psBare, -1, mSandbox)),
		vs(mCNI), p50ms(ps.durations(v, -1, mCNI)), p50ms(ps.durations(psBare, -1, mCNI)), vs(mRest))
}

// podStartNotes explains the section's figures from the run: what the
// plugin's exec and call account for in each variant's extra sandbox
// time, and which phases make Kubernetes mode's AddPod longer.
func (r *report) podStartNotes() string {
	ps := r.res.podStart
	if ps == nil {
		return ""
	}
	var notes []string
	exec := p50ms(ps.versionExec)
	for _, v := range []string{psOut, psCaptured} {
		extra, chain, outside := ps.pooledVs(v, mSandbox, false), ps.pooledVs(v, mCNI, false), ps.pooledVs(v, mRest, false)
		captured := v == psCaptured
		run, call := pluginP50(ps.plugin, captured, true), pluginP50(ps.plugin, captured, false)
		lines := ps.kube[v]
		in := totalP50(lines)
		notes = append(notes, fmt.Sprintf("- *%s*: the sandbox takes %+.1f ms over the bare chain (p50s over all rounds): its CNI ADD %+.1f ms, the rest %+.1f ms. "+
			"nftredir-cni accounts for about %.1f ms of the CNI ADD's: a bare exec of it takes %.2f ms (its start-up and exit), and its run from its Go code's start to the daemon's answer %.2f ms, of which the AddPod call %.2f ms, "+
			"%.2f ms of that in the daemon (%s). The other %+.1f ms is outside the plugin's own timings: its exit after the answer, the runtime's handling of one more plugin, and the chain's other plugins sharing %d cores with nftredir's work%s.",
			v, extra, chain, outside, exec+run, exec, run, call, in, topPhases(lines, 3), chain-exec-run, r.res.machine.cores, proxyNote(captured, ps)))
	}
	proxyCPU := "the stand-in proxy runs inside this program and is not measured"
	if strings.HasPrefix(ps.proxy, "ztunnel") {
		proxyCPU = fmt.Sprintf("ztunnel %.1f, %.1f and %.1f ms during RunPodSandbox, %.1f, %.1f and %.1f ms from Create to Ready",
			ps.cpuP50(psCaptured, true, true), ps.cpuP50(psOut, true, true), ps.cpuP50(psBare, true, true),
			ps.cpuP50(psCaptured, true, false), ps.cpuP50(psOut, true, false), ps.cpuP50(psBare, true, false))
	}
	notes = append(notes, fmt.Sprintf("- *CPU beside the chain* (p50s per pod, captured, not captured, bare chain; each process's CPU clock, sampled every %s): "+
		"nftredird in Kubernetes mode used %.1f, %.1f and %.1f ms of CPU during the pod's RunPodSandbox, %.1f, %.1f and %.1f ms from its Create call until it was Ready; %s. "+
		"CPU they use while the sandbox is made is taken from the chain and containerd on %d cores.",
		cpuSampleEvery, ps.cpuP50(psCaptured, false, true), ps.cpuP50(psOut, false, true), ps.cpuP50(psBare, false, true),
		ps.cpuP50(psCaptured, false, false), ps.cpuP50(psOut, false, false), ps.cpuP50(psBare, false, false),
		proxyCPU, r.res.machine.cores))
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
	notes = append(notes, fmt.Sprintf("- *The run's noise*: the bare chain's p50 ranged from round to round (%d pods a round) %.1f–%.1f ms for RunPodSandbox and %.1f–%.1f ms for its CNI ADD, on a machine whose load average went %s; "+
		"a difference smaller than its measure's range is not resolved by this run.", ps.perRound, sb.lo, sb.hi, chain.lo, chain.hi, loadText(ps.load)))
	if n := floorNote(ps); n != "" {
		notes = append(notes, n)
	}
	same, alone, kube := totalP50(ps.same), totalP50(ps.alone), totalP50(ps.kube[psCaptured])
	notes = append(notes, fmt.Sprintf("- *AddPod in Kubernetes mode*: %.3f ms against %.3f ms standalone with the same ruleset (%.2f×); the phases Kubernetes mode adds or makes longer: %s. "+
		"Against the default spec's standalone AddPod (%.3f ms, %d rules instead of %d, plus the node probe set) it is %.2f×.",
		kube, same, kube/same, extraPhases(ps.same, ps.kube[psCaptured]),
		alone, specRules(false), specRules(defaults.KubernetesCaptureDNS), kube/alone))
	return "Where a pod's start goes, from this run's figures:\n\n" + strings.Join(notes, "\n") + "\n"
}

func proxyNote(captured bool, ps *podStartResult) string {
	if !captured {
		return ""
	}
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

// floorNote sets the sandbox targets beside what no Go plugin can skip:
// its own exec, and for a captured pod also the kernel's work, which
// must be done before the plugin answers for the pod never to run
// uncaptured. Where the run timed true(1), it also says whether a plugin
// in another language could meet a target that no Go plugin meets.
func floorNote(ps *podStartResult) string {
	if len(ps.goExec) == 0 {
		return ""
	}
	goExec, plugin := p50ms(ps.goExec), p50ms(ps.versionExec)
	anyExec := math.NaN()
	if len(ps.anyExec) > 0 {
		anyExec = p50ms(ps.anyExec)
	}
	kernel := phaseP50(ps.kube[psCaptured], "kernel")
	judge := func(target, goFloor, anyFloor float64) string {
		switch {
		case goFloor <= target:
			return fmt.Sprintf("%.1f ms under the target of +%.0f ms", target-goFloor, target)
		case anyFloor > target:
			return fmt.Sprintf("%.1f ms above the target of +%.0f ms, which no plugin meets on this machine, in Go or any other language (true(1) alone: +%.2f ms)", goFloor-target, target, anyFloor)
		case math.IsNaN(anyFloor):
			return fmt.Sprintf("%.1f ms above the target of +%.0f ms, which no Go plugin meets on this machine", goFloor-target, target)
		}
		return fmt.Sprintf("%.1f ms above the target of +%.0f ms, which no Go plugin meets on this machine (true(1), a C program, would leave %.2f ms)", goFloor-target, target, target-anyFloor)
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
	return fmt.Sprintf("- *The floor*: the smallest Go program, started and exited, takes %.2f ms here (nftredir-cni's own bare exec %.2f ms, %+.2f ms more%s%s; all timed turn about, %d times each). "+
		"A pod not captured cannot start with a Go plugin in the chain in less than the bare chain's time + %.2f ms, %s. "+
		"A captured one also waits for the kernel phase (%.2f ms p50 in Kubernetes mode), done before the answer so that the pod never runs uncaptured: "+
		"+%.2f ms, %s.",
		goExec, plugin, plugin-goExec, baseline, anyText, len(ps.goExec), goExec, judge(maxOutExtraMS, goExec, anyExec), kernel, goExec+kernel, judge(maxCapturedExtraMS, goExec+kernel, anyExec+kernel))
}
