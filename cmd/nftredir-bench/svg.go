package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// The chart: one row per method, a box plot on a log axis, so methods a
// factor of thirty apart fit on one scale and the reader sees the gap
// before reading a number.
const (
	svgWidth   = 1000
	labelRight = 290 // labels end here
	plotLeft   = 300
	plotRight  = 770
	noteLeft   = 785
	rowHeight  = 30
	boxHeight  = 14
)

type chartRow struct {
	label string
	color string
	d     dist
}

type chartPanel struct {
	title string
	sub   string
	unit  string  // "ms" or "µs"
	scale float64 // durations are divided by this to get the unit
	rows  []chartRow
}

var (
	colNftredir = "#1d4ed8"
	colIPT      = "#b91c1c"
	colNFT      = "#c2410c"
	colRef      = "#6b7280"
)

func (r *report) chart() string {
	addPanel := chartPanel{
		title: "Programming one pod: latency per pod",
		sub:   fmt.Sprintf("ms, log scale; %d fresh namespaces × %d repetitions per method, pooled", r.cfg.pods, r.cfg.reps),
		unit:  "ms", scale: float64(time.Millisecond),
	}
	for _, m := range r.addMethods() {
		addPanel.rows = append(addPanel.rows, chartRow{strings.Replace(m, "AddPod, ", "AddPod over gRPC, ", 1), colNftredir, pooled(r.res.apply[m])})
	}
	addPanel.rows = append(addPanel.rows,
		chartRow{"iptables-restore + ip rule + ip route", colIPT, pooled(r.res.apply[mIPT])},
		chartRow{"nft -f + ip rule + ip route", colNFT, pooled(r.res.apply[mNFT])},
	)
	dpPanel := chartPanel{
		title: "Data path: latency per connection through capture",
		sub:   "µs, log scale; connect, 1 byte each way, close; client namespace → proxy listener in the pod namespace",
		unit:  "µs", scale: float64(time.Microsecond),
	}
	for _, conc := range r.cfg.dpConc {
		for _, m := range []string{dpNftredir, dpPeer, dpNone} {
			col := map[string]string{dpNftredir: colNftredir, dpPeer: colIPT, dpNone: colRef}[m]
			dpPanel.rows = append(dpPanel.rows, chartRow{dpKey(m, conc), col, pooled(r.res.dp[dpKey(m, conc)])})
		}
	}

	var sb strings.Builder
	y := 0
	panels := []chartPanel{addPanel, dpPanel}
	height := 70
	for _, p := range panels {
		height += 84 + len(p.rows)*rowHeight + 50
	}
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="13">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	seq := r.seqAdd()
	vsIPT := spreadOf(paired(r.res.apply[mIPT], seq, p50Of)).med
	vsNFT := spreadOf(paired(r.res.apply[mNFT], seq, p50Of)).med
	m := r.res.machine
	y += 28
	fmt.Fprintf(&sb, `<text x="20" y="%d" font-size="18" font-weight="bold">nftredir AddPod p50: %s than iptables-restore, %s than nft -f</text>`+"\n", y, times(vsIPT), times(vsNFT))
	y += 20
	fmt.Fprintf(&sb, `<text x="20" y="%d" fill="#444">%s</text>`+"\n", y,
		esc(fmt.Sprintf("%s · %d cores · kernel %s · %s · %s", m.cpu, m.cores, m.kernel, m.goVersion, m.date.Format("2006-01-02"))))
	y += 22
	for _, p := range panels {
		y = p.render(&sb, y)
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

// times renders a ratio baseline ÷ nftredir as "N× faster", or as "N×
// slower" when it is below 1.
func times(v float64) string {
	word := "faster"
	if v < 1 {
		v, word = 1/v, "slower"
	}
	if v < 10 {
		return fmt.Sprintf("%.1f× %s", v, word)
	}
	return fmt.Sprintf("%.0f× %s", v, word)
}

func esc(s string) string { return html.EscapeString(s) }

// render draws the panel from y and returns the y below it.
func (p chartPanel) render(sb *strings.Builder, y int) int {
	// The axis spans the lowest p1 to the highest p99.9: the extremes of
	// tens of thousands of connections would squeeze every box into a
	// corner.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range p.rows {
		if len(r.d) == 0 {
			continue
		}
		lo = math.Min(lo, float64(r.d.q(0.01))/p.scale)
		hi = math.Max(hi, float64(r.d.q(0.999))/p.scale)
	}
	if math.IsInf(lo, 0) || lo <= 0 {
		lo, hi = 1, 10
	}
	ticks := niceTicks(lo, hi)
	lo, hi = ticks[0], ticks[len(ticks)-1]
	x := func(v float64) float64 {
		v = math.Max(lo, math.Min(hi, v))
		return plotLeft + (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(plotRight-plotLeft)
	}
	y += 24
	fmt.Fprintf(sb, `<text x="20" y="%d" font-size="15" font-weight="bold">%s</text>`+"\n", y, esc(p.title))
	y += 18
	fmt.Fprintf(sb, `<text x="20" y="%d" fill="#555" font-size="12">%s</text>`+"\n", y, esc(p.sub))
	y += 24
	top := y
	bottom := y + len(p.rows)*rowHeight
	for _, t := range ticks {
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e5e7eb"/>`+"\n", x(t), top, x(t), bottom)
		fmt.Fprintf(sb, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", x(t), bottom+16, tickLabel(t))
	}
	fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="end" fill="#444">%s</text>`+"\n", plotRight, bottom+32, esc(p.unit))
	fmt.Fprintf(sb, `<text x="%d" y="%d" fill="#444" font-weight="bold">p50 · p99 %s</text>`+"\n", noteLeft, top-4, esc(p.unit))
	for i, r := range p.rows {
		cy := top + i*rowHeight + rowHeight/2
		fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", labelRight, cy, esc(r.label))
		if len(r.d) == 0 {
			continue
		}
		v := func(q float64) float64 { return float64(r.d.q(q)) / p.scale }
		x1, x99 := x(v(0.01)), x(v(0.99))
		x25, x50, x75 := x(v(0.25)), x(v(0.5)), x(v(0.75))
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5"/>`+"\n", x1, cy, x99, cy, r.color)
		for _, wx := range []float64{x1, x99} {
			fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5"/>`+"\n", wx, cy-5, wx, cy+5, r.color)
		}
		fmt.Fprintf(sb, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="0.35" stroke="%s"/>`+"\n",
			x25, cy-boxHeight/2, math.Max(1, x75-x25), boxHeight, r.color, r.color)
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", x50, cy-boxHeight/2-2, x50, cy+boxHeight/2+2, r.color)
		fmt.Fprintf(sb, `<circle cx="%.1f" cy="%d" r="3" fill="white" stroke="%s"/>`+"\n", x(v(0.999)), cy, r.color)
		fmt.Fprintf(sb, `<text x="%d" y="%d" dominant-baseline="middle">%s · %s</text>`+"\n", noteLeft, cy, fmtVal(v(0.5)), fmtVal(v(0.99)))
	}
	y = bottom + 48
	legend := "box: p25–p75 · thick line: median · whiskers: p1–p99 · circle: p99.9"
	fmt.Fprintf(sb, `<text x="%d" y="%d" fill="#555" font-size="12">%s</text>`+"\n", plotLeft, y, esc(legend))
	return y + 8
}

// niceTicks returns 1-2-5 ticks from at or below lo to at or above hi.
func niceTicks(lo, hi float64) []float64 {
	t := math.Pow(10, math.Floor(math.Log10(lo)))
	for nextTick(t) <= lo {
		t = nextTick(t)
	}
	ticks := []float64{t}
	for t < hi {
		t = nextTick(t)
		ticks = append(ticks, t)
	}
	return ticks
}

func nextTick(t float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(t)+1e-9))
	switch m := math.Round(t / e); m {
	case 1:
		return 2 * e
	case 2:
		return 5 * e
	}
	return 10 * e
}

func tickLabel(t float64) string {
	if t >= 1000 {
		return fmt.Sprintf("%.0fk", t/1000)
	}
	if t >= 1 {
		return fmt.Sprintf("%.0f", t)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", t), "0"), ".")
}

func fmtVal(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
