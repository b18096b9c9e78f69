// Package signtest is the sign test the benchmarks judge a difference
// by. Two things are timed in turn, round after round under the same
// conditions; each round says which came out above the other. Were they
// equal, each round would be a coin toss, and a lopsided split would be
// rare: how rare is the test's answer. It assumes nothing of the
// distribution of the times, which on a shared machine have long tails.
package signtest

import "math"

// Significance is the chance under equal things below which a split
// counts as a difference the run resolves: with it, 6 or more rounds all
// on one side resolve one, and of 12, 10 or more on one side.
const Significance = 0.05

// Chance is the two-sided sign test: the chance that two equal things
// split at least as unevenly as above against below (ties left out).
func Chance(above, below int) float64 {
	n, k := above+below, min(above, below)
	if n == 0 {
		return 1
	}
	// P(X ≤ k) for X ~ Binomial(n, 1/2), doubled for either side.
	tail, term := 0.0, math.Pow(0.5, float64(n)) // C(n,0)/2^n
	for i := 0; i <= k; i++ {
		tail += term
		term = term * float64(n-i) / float64(i+1)
	}
	return min(1, 2*tail)
}

// Resolved says whether a split tells a difference from chance.
func Resolved(above, below int) bool { return Chance(above, below) < Significance }

// Count splits differences (a − b, round by round) into those above and
// below zero; ties count for neither.
func Count(diffs []float64) (above, below int) {
	for _, d := range diffs {
		switch {
		case d > 0:
			above++
		case d < 0:
			below++
		}
	}
	return above, below
}
