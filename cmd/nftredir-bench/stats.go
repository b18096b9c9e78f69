package main

import (
	"math"
	"slices"
	"time"
)

// dist is a sorted set of latencies.
type dist []time.Duration

func newDist(ds []time.Duration) dist {
	d := slices.Clone(ds)
	slices.Sort(d)
	return d
}

// q is the nearest-rank quantile: the smallest value with at least p of
// the samples at or below it. With 200 pods p99 is the second largest,
// not an interpolation between two pods that both happened.
func (d dist) q(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

func pooled(samples []*sample) dist {
	var all []time.Duration
	for _, s := range samples {
		all = append(all, s.lat...)
	}
	return newDist(all)
}

// spread is a metric over repetitions: its median and its range.
type spread struct {
	med, lo, hi float64
	n           int
}

func spreadOf(vals []float64) spread {
	if len(vals) == 0 {
		return spread{med: math.NaN(), lo: math.NaN(), hi: math.NaN()}
	}
	v := slices.Clone(vals)
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{med: med, lo: v[0], hi: v[len(v)-1], n: len(v)}
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func usf(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// per maps each sample to one number, in repetition order.
func per(samples []*sample, f func(*sample) float64) []float64 {
	out := make([]float64, len(samples))
	for i, s := range samples {
		out[i] = f(s)
	}
	return out
}

// paired divides a's metric by b's, repetition by repetition: a ratio
// taken within one repetition cancels most of the machine's drift
// between repetitions.
func paired(num, den []*sample, f func(*sample) float64) []float64 {
	byRep := map[int]*sample{}
	for _, s := range den {
		byRep[s.rep] = s
	}
	var out []float64
	for _, s := range num {
		if d, ok := byRep[s.rep]; ok && f(d) != 0 {
			out = append(out, f(s)/f(d))
		}
	}
	return out
}
