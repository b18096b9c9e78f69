package main

import (
	"strings"
	"testing"
	"time"
)

// withBaseline adds both builds' AddPod and RemovePod samples to a fake
// run: at every level, this build's p50 in repetition i is this[i] ms and
// the baseline's base[i] ms.
func withBaseline(t *testing.T, this, base []float64) *report {
	t.Helper()
	r := fakeRun{addP50: ms(1), inDaemon: ms(0.8), iptP50: ms(8), nftP50: ms(10), phases: kernel()}.report(t)
	r.cfg.reps = len(this)
	r.cfg.baselineDaemon = "/tmp/nftredird-old"
	r.res.baseline = &baselineInfo{bin: "/tmp/nftredird-old", version: "nftredird (devel) go1.26.0", rules: 17, thisRules: 17}
	mk := func(method string, rep, conc int, v float64) *sample {
		d := ms(v)
		return &sample{method: method, rep: rep, conc: conc, lat: []time.Duration{d}, wall: d, cpu: 2 * d, inDaemon: []time.Duration{d / 2}}
	}
	for rep := range this {
		for _, c := range r.cfg.conc {
			for _, m := range []string{mAdd(c), mRemove(c)} {
				if rep == 0 {
					r.res.apply[m] = nil
				}
				r.res.apply[m] = append(r.res.apply[m], mk(m, rep, c, this[rep]))
			}
			for _, m := range []string{mAddBase(c), mRemoveBase(c)} {
				r.res.apply[m] = append(r.res.apply[m], mk(m, rep, c, base[rep]))
			}
		}
	}
	return r
}

func TestBaselineNamesKeepTheirRPC(t *testing.T) {
	if got := rpcName(mAddBase(4)); got != "AddPod" {
		t.Errorf("rpcName(%q) = %q", mAddBase(4), got)
	}
	if got := rpcName(mRemoveBase(4)); got != "RemovePod" {
		t.Errorf("rpcName(%q) = %q", mRemoveBase(4), got)
	}
	if mAddBase(1) == mAdd(1) || mRemoveBase(1) == mRemove(1) {
		t.Error("the baseline build's methods share this build's names")
	}
}

func TestBaselineReportFasterInEveryRepetition(t *testing.T) {
	// Ratios 0.800, 0.846, 0.750 and three more: this build faster each
	// time, in enough repetitions (6) to resolve it.
	r := withBaseline(t, []float64{1.0, 1.1, 0.9, 1.0, 1.1, 0.9}, []float64{1.25, 1.3, 1.2, 1.25, 1.3, 1.2})
	tb := r.baselineTable()
	if len(tb.rows) != 2*len(r.cfg.conc) {
		t.Fatalf("%d rows, want AddPod and RemovePod at %d levels", len(tb.rows), len(r.cfg.conc))
	}
	row := tb.rows[0]
	want := []string{"AddPod, 1 concurrent", "1.00 [0.90–1.10]", "1.25 [1.20–1.30]", "0.800× [0.750–0.846]", "0.50 [0.45–0.55]", "0.62 [0.60–0.65]", "2.000 [1.800–2.200]", "2.500 [2.400–2.600]"}
	if strings.Join(row, "|") != strings.Join(want, "|") {
		t.Errorf("first row\n got %q\nwant %q", row, want)
	}
	if last := tb.rows[len(tb.rows)-1][0]; last != "RemovePod, 16 concurrent" {
		t.Errorf("last row is %q", last)
	}
	notes := strings.Join(tb.notes, "\n")
	for _, w := range []string{"*AddPod, 1 concurrent*: this build was faster, its p50 0.800× the baseline's (20.0% less time; median of the repetitions' ratios; medians of the p50s 1.000 ms and 1.250 ms), in every one of 6 repetitions (ratio 0.750–0.846); two equal builds would show that 3.1% of the time.",
		"*RemovePod, 16 concurrent*: this build was faster", "same number of rules per pod (17)"} {
		if !strings.Contains(notes, w) {
			t.Errorf("notes lack %q:\n%s", w, notes)
		}
	}
	if strings.Contains(notes, "does not resolve") {
		t.Errorf("a difference in every repetition is called unresolved:\n%s", notes)
	}
}

func TestBaselineReportStraddlingOne(t *testing.T) {
	// Ratios 0.950, 1.020, 1.050: the median favours the baseline, the
	// range does not.
	r := withBaseline(t, []float64{0.95, 1.02, 1.05}, []float64{1, 1, 1})
	notes := strings.Join(r.baselineTable().notes, "\n")
	want := "*AddPod, 4 concurrent*: the baseline build was faster, this build's p50 1.020× the baseline's (2.0% more time; median of the repetitions' ratios; medians of the p50s 1.020 ms and 1.000 ms) at the median, " +
		"but the ratio ranged 0.950–1.050 over 3 repetitions, either side of 1: the run does not resolve a difference."
	if !strings.Contains(notes, want) {
		t.Errorf("notes lack %q:\n%s", want, notes)
	}
	if strings.Contains(notes, "in every one") {
		t.Errorf("a straddling range is called consistent:\n%s", notes)
	}
}

func TestBaselineReportSlowerAndSingleRepetition(t *testing.T) {
	notes := strings.Join(withBaseline(t, []float64{1.5, 1.4, 1.6}, []float64{1, 1, 1}).baselineTable().notes, "\n")
	if !strings.Contains(notes, "the baseline build was faster, this build's p50 1.500× the baseline's (50.0% more time") || !strings.Contains(notes, "in every one of 3 repetitions (ratio 1.400–1.600)") {
		t.Errorf("a slower build is not said to be slower in every repetition:\n%s", notes)
	}
	// Three repetitions on one side happen to equal builds 1 time in 4.
	if !strings.Contains(notes, "which two equal builds would also show 25% of the time: the run does not resolve a difference; more repetitions (-reps) would.") {
		t.Errorf("3 repetitions on one side are taken as resolving a difference:\n%s", notes)
	}
	notes = strings.Join(withBaseline(t, []float64{0.9}, []float64{1}).baselineTable().notes, "\n")
	if !strings.Contains(notes, "this build was faster, its p50 0.900× the baseline's (10.0% less time; median of the repetitions' ratios; medians of the p50s 0.900 ms and 1.000 ms); one repetition gives no range to judge it by, so the run does not resolve a difference.") {
		t.Errorf("one repetition is judged:\n%s", notes)
	}
}

func TestBaselineReportNamesADifferentRuleset(t *testing.T) {
	r := withBaseline(t, []float64{1, 1, 1}, []float64{1, 1, 1})
	r.res.baseline.rules = 15
	notes := strings.Join(r.baselineTable().notes, "\n")
	if !strings.Contains(notes, "15 rules per pod for the baseline, 17 for this build") {
		t.Errorf("notes do not name the rulesets' difference:\n%s", notes)
	}
	if !strings.Contains(notes, "the two builds' p50s were equal") {
		t.Errorf("equal p50s are not called equal:\n%s", notes)
	}
}

func TestMarkdownHasTheBaselineSectionOnlyWithABaseline(t *testing.T) {
	r := withBaseline(t, []float64{1, 1.1, 0.9}, []float64{1.2, 1.2, 1.2})
	md := r.markdown("BENCHMARKS.md", "")
	for _, w := range []string{"## " + baselineSection + "\n", "| baseline nftredird | `/tmp/nftredird-old`: nftredird (devel) go1.26.0 |", "`-baseline-daemon`, `-only-baseline`", "- **Baseline build**"} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q", w)
		}
	}
	if i, j := strings.Index(md, "## Programming one pod"), strings.Index(md, "## "+baselineSection); i < 0 || j < i || j > strings.Index(md, "## The baselines' commands") {
		t.Errorf("the baseline section is not between the apply table and the baselines' commands")
	}
	plain := fakeRun{addP50: ms(1), inDaemon: ms(0.8), iptP50: ms(8), nftP50: ms(10), phases: kernel()}.report(t).markdown("BENCHMARKS.md", "")
	if strings.Contains(plain, baselineSection) || strings.Contains(plain, "baseline nftredird") || strings.Contains(plain, "**Baseline build**") {
		t.Error("a run without -baseline-daemon reports a baseline build")
	}
	if !strings.Contains(plain, "## Programming one pod") || !strings.Contains(plain, "## The baselines' commands") || !strings.Contains(plain, "## Data path") {
		t.Error("sections lost their names")
	}
}

func TestParseBaselineFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-only-baseline"},
		{"-only-baseline", "-baseline-daemon", "x", "-out", "B.md"},
		{"-only-baseline", "-baseline-daemon", "x", "-only-cni"},
		{"-baseline-cni", "x", "-no-podstart"},
		{"-baseline-cni", "x", "-only-cni"},
	} {
		if _, err := parseFlags(args, &strings.Builder{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	cfg, err := parseFlags([]string{"-quick", "-only-baseline", "-baseline-daemon", "x"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.out != "" || cfg.svg != "" || cfg.pods != 4 || cfg.reps != 1 || cfg.baselineDaemon != "x" {
		t.Errorf("-quick -only-baseline: out %q svg %q pods %d reps %d baseline %q", cfg.out, cfg.svg, cfg.pods, cfg.reps, cfg.baselineDaemon)
	}
	if cfg, err := parseFlags([]string{"-only-baseline", "-baseline-daemon", "x"}, &strings.Builder{}); err != nil || cfg.out != "" {
		t.Errorf("-only-baseline writes %q (%v)", cfg.out, err)
	}
}
