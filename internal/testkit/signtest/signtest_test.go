package signtest

import (
	"math"
	"testing"
)

// TestChance: the binomial tail, doubled; all on one side of n rounds is
// 2·2^-n.
func TestChance(t *testing.T) {
	for _, c := range []struct {
		above, below int
		want         float64
	}{
		{0, 0, 1}, {3, 0, 0.25}, {0, 6, 0.03125}, {6, 6, 1},
		{10, 2, 0.0386}, {9, 3, 0.146}, {1, 11, 0.00635}, {60, 40, 0.0569},
	} {
		if got := Chance(c.above, c.below); math.Abs(got-c.want) > 0.0005 {
			t.Errorf("Chance(%d, %d) = %.5f, want %.4f", c.above, c.below, got, c.want)
		}
	}
	if !Resolved(10, 2) || Resolved(9, 3) || Resolved(5, 0) || !Resolved(0, 6) {
		t.Error("of 12 rounds 10 on one side resolve a difference, 9 do not; all of 5 do not, all of 6 do")
	}
}

func TestCount(t *testing.T) {
	if a, b := Count([]float64{1, -0.5, 0, 2, 3}); a != 3 || b != 1 {
		t.Errorf("Count = %d above, %d below; want 3 and 1, the tie in neither", a, b)
	}
}
