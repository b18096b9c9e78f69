package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errBusy = errors.New("busy")

func TestDo(t *testing.T) {
	busy := func(err error) bool { return errors.Is(err, errBusy) }
	s := Schedule{Attempts: 4, Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	tests := []struct {
		name  string
		fails []error // what the tries return, in order; then nil
		calls int
		err   error
	}{
		{"first try", nil, 1, nil},
		{"after two busy", []error{errBusy, errBusy}, 3, nil},
		{"not retried", []error{errors.New("refused")}, 1, errors.New("refused")},
		{"out of attempts", []error{errBusy, errBusy, errBusy, errBusy, errBusy}, 4, errBusy},
	}
	for _, tt := range tests {
		calls := 0
		got, err := Do(context.Background(), s, busy, func(context.Context) (int, error) {
			calls++
			if calls <= len(tt.fails) {
				return calls, tt.fails[calls-1]
			}
			return calls, nil
		})
		if calls != tt.calls || got != calls || (err == nil) != (tt.err == nil) || (err != nil && err.Error() != tt.err.Error()) {
			t.Errorf("%s: %d calls, result %d, %v; want %d calls and %v", tt.name, calls, got, err, tt.calls, tt.err)
		}
	}
}

// A context that ends during a pause returns the failure that made the
// call wait, not the context's error.
func TestDoKeepsTheFailureWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	calls := 0
	_, err := Do(ctx, Schedule{Attempts: 100, Backoff: time.Hour, MaxBackoff: time.Hour}, func(error) bool { return true },
		func(context.Context) (struct{}, error) { calls++; return struct{}{}, errBusy })
	if !errors.Is(err, errBusy) || calls != 1 {
		t.Errorf("%d calls, %v; want one call and the busy error", calls, err)
	}
}

// A try the context cuts short (its deadline mid-request) returns the
// failure before it, not the context's error: a caller on a busy machine
// reads "503" rather than "context deadline exceeded".
func TestDoKeepsTheFailureWhenTheContextCutsATry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	_, err := Do(ctx, Schedule{Attempts: 100, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}, func(error) bool { return true },
		func(ctx context.Context) (struct{}, error) {
			calls++
			if calls == 1 {
				return struct{}{}, errBusy
			}
			cancel()
			return struct{}{}, ctx.Err()
		})
	if !errors.Is(err, errBusy) || calls != 2 {
		t.Errorf("%d calls, %v; want two calls and the busy error", calls, err)
	}
}
