package nri

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/hashicorp/go-hclog"
)

// Reconnection backoff. A connection that ends (the runtime restarted,
// timed the plugin out, or failed its Synchronize) leaves the node's pods
// waiting at the validator until the next one succeeds, so the first
// retry is quick; a runtime that is not there is asked less often.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
	// refusedBackoff paces a runtime the plugin refuses: it may be
	// upgraded and restarted, and is then asked again.
	refusedBackoff = time.Minute
	// stableAfter is how long a connection must have lasted for the next
	// one to start from minBackoff again.
	stableAfter = 10 * time.Second
)

// failurePolicy asks runtimes that honour it (NRI 0.12.4 and later) to
// fail a request the plugin could not answer, a timeout among them,
// instead of letting the sandbox proceed without the plugin; and to keep
// the plugin registered after a timeout, so that one slow answer does not
// hold every pod of the node at the validator until it reconnects.
// Earlier runtimes ignore it.
func failurePolicy() *api.FailurePolicy {
	return &api.FailurePolicy{FailRequest: true, KeepConnected: true}
}

// Run connects the plugin to the runtime and keeps it connected until ctx
// ends: every connection that ends is followed by another, with backoff.
// The first attempt's outcome is reported on first (registered, or why
// not), so the daemon can wait for it; first may be nil.
func (p *Plugin) Run(ctx context.Context, first chan<- error) {
	delay := minBackoff
	for {
		start := time.Now()
		err := p.connect(ctx, first)
		first = nil
		if ctx.Err() != nil {
			p.update(func(s *State) { s.Registered, s.Err = false, "stopped" })
			return
		}
		st := p.State()
		if time.Since(start) > stableAfter {
			delay = minBackoff
		}
		wait := delay
		if st.Refused != "" {
			wait = refusedBackoff
		}
		p.log.Warn("not connected to the runtime's NRI; connecting again", "socket", p.socket, "in", wait, "error", err)
		select {
		case <-ctx.Done():
			p.update(func(s *State) { s.Registered, s.Err = false, "stopped" })
			return
		case <-time.After(wait):
		}
		delay = min(2*delay, maxBackoff)
	}
}

// connect makes one connection and returns when it ends.
func (p *Plugin) connect(ctx context.Context, first chan<- error) error {
	registered := make(chan struct{})
	st, err := stub.New(p,
		stub.WithPluginName(p.name),
		stub.WithPluginIdx(p.index),
		stub.WithSocketPath(p.socket),
		stub.WithLogger(stubLogger{p.log.Named("stub")}),
		stub.WithFailurePolicy(failurePolicy()),
	)
	if err != nil {
		// The plugin's own definition is wrong: no runtime can fix that.
		err = fmt.Errorf("nri plugin: %w", err)
		p.ended(err, first)
		return err
	}
	p.conn.Store(&st)
	defer p.conn.Store(nil)
	p.synced.Store(&registered)
	defer p.synced.Store(nil)
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	select {
	case <-registered:
		if first != nil {
			first <- nil
			first = nil
		}
		err = <-done
	case err = <-done:
	}
	if err == nil {
		err = errors.New("the runtime closed the connection")
	}
	p.ended(err, first)
	return err
}

// ended records a connection's end (or failure to start).
func (p *Plugin) ended(err error, first chan<- error) {
	p.update(func(s *State) { s.Registered, s.Err = false, err.Error() })
	if first != nil {
		first <- err
	}
}

// stubLogger puts the NRI library's messages into the daemon's log.
type stubLogger struct{ log hclog.Logger }

func (l stubLogger) Debugf(_ context.Context, format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}

func (l stubLogger) Infof(_ context.Context, format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}

func (l stubLogger) Warnf(_ context.Context, format string, args ...any) {
	l.log.Warn(fmt.Sprintf(format, args...))
}

func (l stubLogger) Errorf(_ context.Context, format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
}
