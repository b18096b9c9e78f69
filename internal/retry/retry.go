// Package retry repeats a call that failed in a way that clears by itself
// (the daemon not listening while it restarts), with doubling pauses,
// while the caller's context allows. Both of nftredir's clients, package
// client and nftredir-cni's own, use it, so they ride out a restart alike.
// It imports nothing that would grow the CNI plugin.
package retry

import (
	"context"
	"time"

	"github.com/nftredir/nftredir/internal/defaults"
)

// Schedule is how often and how patiently a call is repeated.
type Schedule struct {
	// Attempts is how often the call runs in all; 1 or less: once.
	Attempts int
	// Backoff is the first pause, doubled after each try up to
	// MaxBackoff.
	Backoff, MaxBackoff time.Duration
}

// Default is the callers' schedule, internal/defaults' Call*.
func Default() Schedule {
	return Schedule{Attempts: defaults.CallAttempts, Backoff: defaults.CallBackoff, MaxBackoff: defaults.CallMaxBackoff}
}

// Do runs f until it returns an error again does not accept, has run
// s.Attempts times, or ctx ends. It returns f's last result, except that
// when ctx ends, during a pause or by cutting a try short, the error is
// the failure that made it try again, which says more than the deadline.
func Do[T any](ctx context.Context, s Schedule, again func(error) bool, f func(context.Context) (T, error)) (T, error) {
	pause := s.Backoff
	var failed error
	for attempt := 1; ; attempt++ {
		resp, err := f(ctx)
		if err != nil && failed != nil && ctx.Err() != nil {
			return resp, failed
		}
		if err == nil || !again(err) || attempt >= s.Attempts {
			return resp, err
		}
		failed = err
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return resp, err
		case <-t.C:
		}
		pause = min(2*pause, s.MaxBackoff)
	}
}
