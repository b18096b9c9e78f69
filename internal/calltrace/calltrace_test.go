package calltrace

import (
	"context"
	"testing"
	"time"
)

func TestMarksSumPhasesInOrder(t *testing.T) {
	ctx, tr := New(context.Background())
	time.Sleep(2 * time.Millisecond)
	Mark(ctx, "open")
	time.Sleep(3 * time.Millisecond)
	Mark(ctx, "kernel")
	time.Sleep(1 * time.Millisecond)
	Mark(ctx, "open") // a phase that recurs adds up
	f := tr.Fields()
	if len(f) != 4 || f[0] != "phase.open_ms" || f[2] != "phase.kernel_ms" {
		t.Fatalf("fields %v: want open then kernel", f)
	}
	if open := f[1].(float64); open < 3 || open > 50 {
		t.Errorf("open took %v ms, want the sum of 2 and 1 ms sleeps", open)
	}
	if k := f[3].(float64); k < 3 || k > 50 {
		t.Errorf("kernel took %v ms, want about 3", k)
	}
}

func TestNoTraceIsFine(t *testing.T) {
	Mark(context.Background(), "x")
	if From(context.Background()).Fields() != nil {
		t.Error("a nil trace has fields")
	}
}
