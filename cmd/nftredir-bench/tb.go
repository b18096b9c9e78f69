package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
)

// progTB is the testing.TB that the project's test rigs (internal/kcluster,
// internal/istiotest, internal/zdstest) take, for this program: the pod
// start section runs the same real cluster the e2e tests run, through the
// same code. It behaves as testing's own does where the rigs rely on it:
// Fatal ends the calling goroutine (runProg runs the body in one of its
// own), and Cleanup functions run last-in first-out at the end.
type progTB struct {
	// testing.TB is never called: it only supplies the unexported method
	// that keeps other packages from implementing the interface. Every
	// method the rigs call is defined below.
	testing.TB
	logf   func(format string, args ...any)
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	skipped  bool
	msgs     []string
}

func newProgTB(ctx context.Context, logf func(format string, args ...any)) *progTB {
	t := &progTB{logf: logf}
	t.ctx, t.cancel = context.WithCancel(ctx)
	return t
}

// run calls body in a goroutine of its own, as testing runs a test, and
// reports a Fatal or Skip in it (or in its Errorf calls) as an error.
func (t *progTB) run(body func(t *progTB)) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		body(t)
	}()
	<-done
	return t.err()
}

func (t *progTB) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.skipped:
		return fmt.Errorf("skipped: %s", last(t.msgs))
	case t.failed:
		return errors.New(last(t.msgs))
	}
	return nil
}

func last(msgs []string) string {
	if len(msgs) == 0 {
		return "failed"
	}
	return msgs[len(msgs)-1]
}

// finish runs the cleanups, newest first, each in a goroutine of its own
// so that a Fatal in one does not end the caller; it returns the run's
// error including what the cleanups reported.
func (t *progTB) finish() error {
	t.cancel()
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("cleanup panicked: %v", p)
				}
			}()
			f()
		}()
		<-done
	}
	return t.err()
}

func (t *progTB) Helper()                           {}
func (t *progTB) Name() string                      { return "nftredir-bench" }
func (t *progTB) Context() context.Context          { return t.ctx }
func (t *progTB) Log(args ...any)                   { t.logf("%s", fmt.Sprint(args...)) }
func (t *progTB) Logf(format string, args ...any)   { t.logf(format, args...) }
func (t *progTB) Error(args ...any)                 { t.fail(fmt.Sprint(args...)) }
func (t *progTB) Errorf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }
func (t *progTB) Fail()                             { t.fail("failed") }
func (t *progTB) FailNow()                          { t.fail("failed"); runtime.Goexit() }
func (t *progTB) Fatal(args ...any)                 { t.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (t *progTB) Fatalf(format string, args ...any) {
	t.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (t *progTB) Skip(args ...any)                 { t.skip(fmt.Sprint(args...)) }
func (t *progTB) Skipf(format string, args ...any) { t.skip(fmt.Sprintf(format, args...)) }
func (t *progTB) SkipNow()                         { t.skip("skipped") }

func (t *progTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *progTB) Skipped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.skipped
}

func (t *progTB) fail(msg string) {
	t.mu.Lock()
	t.failed = true
	t.msgs = append(t.msgs, msg)
	t.mu.Unlock()
	t.logf("error: %s", msg)
}

func (t *progTB) skip(msg string) {
	t.mu.Lock()
	t.skipped = true
	t.msgs = append(t.msgs, msg)
	t.mu.Unlock()
	runtime.Goexit()
}

func (t *progTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *progTB) TempDir() string {
	dir, err := os.MkdirTemp("", "nftr-bench-tb-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *progTB) Setenv(key, value string) {
	old, had := os.LookupEnv(key)
	os.Setenv(key, value)
	t.Cleanup(func() {
		if had {
			os.Setenv(key, old)
		} else {
			os.Unsetenv(key)
		}
	})
}
