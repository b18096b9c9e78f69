// Package calltrace times the phases of one API call, so the daemon's
// request log line says where the call's time went (e.g. an AddPod's
// policy lookup, record write, kernel work and proxy hand-off) without a
// tracing system on the node. A trace rides in the call's context; code
// on the path marks the end of each phase, and whoever logs the call
// (the gRPC server's logging interceptor, the NRI handler) reads the
// trace when the call finishes.
package calltrace

import (
	"context"
	"sync"
	"time"
)

// Trace is one call's phases, in the order they ended.
type Trace struct {
	mu     sync.Mutex
	last   time.Time
	names  []string
	phases map[string]time.Duration
}

type key struct{}

// New starts a trace at now and returns the context that carries it.
func New(ctx context.Context) (context.Context, *Trace) {
	t := &Trace{last: time.Now(), phases: map[string]time.Duration{}}
	return context.WithValue(ctx, key{}, t), t
}

// From is ctx's trace, or nil.
func From(ctx context.Context) *Trace {
	t, _ := ctx.Value(key{}).(*Trace)
	return t
}

// Mark ends the phase name: the time since the previous mark (or the
// trace's start) is added to it. A context without a trace is fine.
func Mark(ctx context.Context, name string) {
	if t := From(ctx); t != nil {
		t.Mark(name)
	}
}

// Mark ends the phase name (see the package function).
func (t *Trace) Mark(name string) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.phases[name]; !ok {
		t.names = append(t.names, name)
	}
	t.phases[name] += now.Sub(t.last)
	t.last = now
}

// FieldPrefix starts the name of every phase's log field:
// "phase.<name>_ms".
const FieldPrefix = "phase."

// Fields are the phases as log key/value pairs, "phase.<name>_ms" with
// milliseconds to the microsecond, in the order the phases ended.
func (t *Trace) Fields() []any {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]any, 0, 2*len(t.names))
	for _, n := range t.names {
		out = append(out, FieldPrefix+n+"_ms", Millis(t.phases[n]))
	}
	return out
}

// Millis is d in milliseconds to the microsecond, as log fields carry
// times.
func Millis(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
