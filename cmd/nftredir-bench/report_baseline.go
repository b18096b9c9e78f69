package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/nftredir/nftredir/internal/testkit/signtest"
)

const baselineSection = "This build against a baseline build"

// baselineRow is one RPC at one concurrency, both builds' samples.
type baselineRow struct {
	label      string
	this, base []*sample
}

func (r *report) baselineRows() []baselineRow {
	var rows []baselineRow
	for _, names := range []struct{ this, base func(int) string }{{mAdd, mAddBase}, {mRemove, mRemoveBase}} {
		for _, c := range r.cfg.conc {
			rows = append(rows, baselineRow{
				label: strings.TrimPrefix(names.this(c), "nftredir "),
				this:  r.res.apply[names.this(c)],
				base:  r.res.apply[names.base(c)],
			})
		}
	}
	return rows
}

// spreadCell is cell, or "–" without samples.
func spreadCell(ss []*sample, f func(*sample) float64, prec int) string {
	if len(ss) == 0 {
		return "–"
	}
	return cell(spreadOf(per(ss, f)), prec)
}

func inDaemonCell(ss []*sample) string {
	if len(ss) == 0 {
		return "–"
	}
	return daemonCell(ss)
}

func (r *report) baselineTable() table {
	t := table{
		title: fmt.Sprintf("%s: AddPod and RemovePod through each build's daemon, %d fresh namespaces per sample, %d repetitions, median [min–max] over repetitions",
			baselineSection, r.cfg.pods, r.cfg.reps),
		head: []string{"method", "this p50 ms", "baseline p50 ms", "this ÷ baseline (p50)", "this in the daemon p50 ms", "baseline in the daemon p50 ms",
			"this CPU ms/op", "baseline CPU ms/op"},
	}
	for _, row := range r.baselineRows() {
		if len(row.this) == 0 && len(row.base) == 0 {
			continue
		}
		t.rows = append(t.rows, []string{row.label,
			spreadCell(row.this, p50Of, 2), spreadCell(row.base, p50Of, 2),
			ratioCell(spreadOf(paired(row.this, row.base, p50Of))),
			inDaemonCell(row.this), inDaemonCell(row.base),
			spreadCell(row.this, cpuOf, 3), spreadCell(row.base, cpuOf, 3)})
	}
	t.notes = []string{r.baselineMethodNote(), r.baselineVerdicts()}
	if r.cfg.quick {
		t.notes = append(t.notes, "Quick run: a smoke test of the benchmark, not a measurement.")
	}
	return t
}

// baselineMethodNote says how the two builds were measured and whether
// they programmed the same ruleset.
func (r *report) baselineMethodNote() string {
	var sb strings.Builder
	sb.WriteString("The baseline build is an earlier nftredird binary (`-baseline-daemon`, see the machine section). Both daemons ran at once, each with its own state dir " +
		"and its own node namespace, started with the same flags, and were called by the same client code. In each repetition the two builds' samples at one " +
		"concurrency run one after the other in the rotation, the first of them alternating from repetition to repetition. " +
		"The ratio is taken within each repetition (this build's p50 ÷ the baseline's), then summarised: below 1 this build was faster. " +
		"CPU ms/op is the daemon's plus this program's CPU time ÷ calls.")
	if b := r.res.baseline; b != nil && b.rules > 0 && b.thisRules > 0 {
		if b.rules == b.thisRules {
			fmt.Fprintf(&sb, " Both builds programmed the same number of rules per pod (%d).", b.rules)
		} else {
			fmt.Fprintf(&sb, " The builds programmed different rulesets: %d rules per pod for the baseline, %d for this build; the comparison includes that difference.", b.rules, b.thisRules)
		}
	}
	return sb.String()
}

// baselineVerdicts says, per row and from the figures, which build was
// faster and by how much, and whether the run tells that from noise.
func (r *report) baselineVerdicts() string {
	var lines []string
	for _, row := range r.baselineRows() {
		if len(row.this) == 0 || len(row.base) == 0 {
			continue
		}
		lines = append(lines, fmt.Sprintf("- *%s*: %s", row.label,
			baselineVerdict(spreadOf(paired(row.this, row.base, p50Of)), spreadOf(per(row.this, p50Of)).med, spreadOf(per(row.base, p50Of)).med)))
	}
	if len(lines) == 0 {
		return "No repetition measured both builds."
	}
	return "What the run shows, p50 against p50:\n\n" + strings.Join(lines, "\n")
}

// baselineVerdict words a ratio this ÷ baseline over repetitions, with
// the medians of the two builds' p50s (ms).
func baselineVerdict(ratio spread, this, base float64) string {
	if math.IsNaN(ratio.med) {
		return "no repetition has both builds' samples."
	}
	// The verdict is the ratios' median, taken repetition by repetition;
	// the medians of the two p50s can order the other way, so they are
	// named as what they are.
	figures := fmt.Sprintf("median of the repetitions' ratios; medians of the p50s %.3f ms and %.3f ms", this, base)
	var lead string
	switch {
	case ratio.med < 1:
		lead = fmt.Sprintf("this build was faster, its p50 %.3f× the baseline's (%.1f%% less time; %s)", ratio.med, 100*(1-ratio.med), figures)
	case ratio.med > 1:
		lead = fmt.Sprintf("the baseline build was faster, this build's p50 %.3f× the baseline's (%.1f%% more time; %s)", ratio.med, 100*(ratio.med-1), figures)
	default:
		lead = fmt.Sprintf("the two builds' p50s were equal (%s)", figures)
	}
	switch {
	case ratio.n <= 1:
		return lead + "; one repetition gives no range to judge it by, so the run does not resolve a difference."
	case ratio.lo <= 1 && ratio.hi >= 1:
		return lead + fmt.Sprintf(" at the median, but the ratio ranged %.3f–%.3f over %d repetitions, either side of 1: the run does not resolve a difference.", ratio.lo, ratio.hi, ratio.n)
	}
	// All on one side of 1 is also what two equal builds show now and
	// then: each repetition is a coin toss, so n of them agree with
	// chance 2·2^-n (the sign test). Below 5% the run resolves the
	// difference; above, it only hints at it.
	chance := signtest.Chance(ratio.n, 0)
	every := lead + fmt.Sprintf(", in every one of %d repetitions (ratio %.3f–%.3f)", ratio.n, ratio.lo, ratio.hi)
	if chance >= signtest.Significance {
		return every + fmt.Sprintf(", which two equal builds would also show %.0f%% of the time: the run does not resolve a difference; more repetitions (-reps) would.", 100*chance)
	}
	return every + fmt.Sprintf("; two equal builds would show that %.1f%% of the time.", 100*chance)
}
