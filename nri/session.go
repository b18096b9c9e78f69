package nri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/containerd/ttrpc"
)

// dialTimeout bounds the dial of the runtime's socket, as every other
// step of a connection attempt is bounded.
const dialTimeout = 5 * time.Second

// session is one connection to the runtime, and the handler the NRI
// library's stub calls on it: the plugin's handlers, through which the
// session follows where the connection stands. Each connection has its
// own, so that a handler that outlives its connection (a Synchronize
// still enrolling pods when the runtime exits) cannot speak for the
// plugin once the connection has ended.
type session struct {
	*Plugin
	// ctx is Run's: the daemon stopping ends the connection's dial.
	ctx  context.Context
	stub stub.Stub

	// registered is closed once the runtime has answered the plugin's
	// registration, configured once it has called Configure, synced once
	// a Synchronize on this connection has succeeded and the plugin
	// counts as registered.
	registered, configured, synced *closer
	// broken is closed once the connection's reads fail: it has dropped.
	broken *closer
	// abandoned: the plugin gave up on the connection before Configure;
	// a Configure that still arrives is refused.
	abandoned atomic.Bool
	// conn is the connection the stub dialled, for the session to close.
	conn atomic.Pointer[net.Conn]
}

func newSession(ctx context.Context, p *Plugin) *session {
	return &session{Plugin: p, ctx: ctx, registered: newCloser(), configured: newCloser(), synced: newCloser(), broken: newCloser()}
}

// closer is a channel closed once, by whichever event comes first.
type closer struct {
	once sync.Once
	c    chan struct{}
}

func newCloser() *closer { return &closer{c: make(chan struct{})} }

func (c *closer) close()                { c.once.Do(func() { close(c.c) }) }
func (c *closer) done() <-chan struct{} { return c.c }

// dial connects to the runtime's socket for the stub, keeping the
// connection so that the session can close it and see it drop.
func (s *session) dial(path string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(s.ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	var wc net.Conn = &watchedConn{Conn: c, broken: s.broken}
	s.conn.Store(&wc)
	return wc, nil
}

// watchedConn tells its session when a read fails: the connection is
// gone, whoever closed it.
type watchedConn struct {
	net.Conn
	broken *closer
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.broken.close()
	}
	return n, err
}

// watchRegistration notes, for the stub's calls to the runtime, when the
// runtime has accepted the plugin's registration: Configure is due next.
func (s *session) watchRegistration(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	err := invoke(ctx, req, resp)
	if err == nil && req.Method == "RegisterPlugin" && (resp.Status == nil || resp.Status.Code == 0) {
		s.registered.close()
	}
	return err
}

// errAbandoned is a Configure's answer on a connection the plugin has
// given up on.
var errAbandoned = errors.New("nftredir gave this connection up before the runtime configured it")

// abandonKey marks the Configure the session makes itself to release
// the stub (releaseStart).
type abandonKey struct{}

// Configure is the runtime's first call on the connection; the plugin
// decides whether to register.
func (s *session) Configure(ctx context.Context, _, runtime, version string) (api.EventMask, error) {
	if s.abandoned.Load() || ctx.Value(abandonKey{}) != nil {
		return 0, errAbandoned
	}
	s.configured.close()
	return s.configure(runtime, version, s.stub.RuntimeNRIVersion(), s.stub.RequestTimeout())
}

// Synchronize brings every pod the runtime lists in line; once it has,
// and only while its connection is the plugin's current one, the plugin
// counts as registered.
func (s *session) Synchronize(ctx context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	start := time.Now()
	captured, err := s.synchronize(ctx, pods, containers)
	if err != nil {
		return nil, err
	}
	current := false
	s.update(func(st *State) {
		if current = s.current == s; current {
			st.Registered, st.Err = true, ""
		}
	})
	if !current {
		s.log.Warn("Synchronize finished after its connection ended; not registered", "pods", len(pods), "captured", captured, "took", time.Since(start))
		return nil, errors.New("nftredir: the connection ended during Synchronize")
	}
	s.log.Info("Synchronize: every pod in line; registered", "pods", len(pods), "captured", captured, "took", time.Since(start))
	s.synced.close()
	return nil, nil
}

// awaitConfigure waits for the runtime's Configure, with which the
// connection either goes on to Synchronize or ends (the plugin refused
// the runtime); it returns nil once Configure has come, else the error
// that ended the connection, after the stub's Run has returned.
//
// Between the runtime's answer to the registration and its Configure,
// the NRI library's stub (v0.12.5) waits for Configure holding its lock,
// with nothing to end the wait: not its context, not a timeout, not the
// connection's end (its close handler waits for the same lock). A
// connection that drops there, or a runtime that never configures, would
// hold the plugin unregistered, and this goroutine, for ever. So the wait
// ends here instead: when the connection drops, when ctx ends, or after
// the configure timeout; the connection is then closed, the stub
// released, and Run connects again with its backoff.
func (s *session) awaitConfigure(ctx context.Context, done <-chan error) error {
	// Until the registration is answered the stub bounds its own wait
	// (its registration timeout, and ctx).
	select {
	case <-s.registered.done():
	case <-s.configured.done():
		return nil
	case err := <-done:
		return err
	}
	timer := time.NewTimer(s.configureTimeout)
	defer timer.Stop()
	var why error
	select {
	case <-s.configured.done():
		return nil
	case err := <-done:
		return err
	case <-s.broken.done():
		why = errors.New("the connection dropped after the runtime accepted the registration, before it configured the plugin")
	case <-timer.C:
		why = fmt.Errorf("the runtime did not configure the plugin within %s of accepting its registration", s.configureTimeout)
	case <-ctx.Done():
		why = ctx.Err()
	}
	s.abandoned.Store(true)
	if c := s.conn.Load(); c != nil {
		(*c).Close()
	}
	if !s.releaseStart() {
		s.log.Error("cannot release the NRI library's wait for Configure; one goroutine stays behind", "error", why)
		return why
	}
	<-done
	return why
}

// releaseStart ends the stub's wait for Configure with a Configure of the
// session's own, which the session refuses: the stub's Start then fails
// and cleans its connection up, as for a runtime's refused Configure. The
// stub serves the runtime's calls to the plugin, so it implements the NRI
// plugin service; false if a version of the library does not.
func (s *session) releaseStart() bool {
	svc, ok := s.stub.(api.PluginService)
	if !ok {
		return false
	}
	ctx := context.WithValue(context.Background(), abandonKey{}, true)
	// A version of its own, so that the stub does not try to infer one.
	_, _ = svc.Configure(ctx, &api.ConfigureRequest{NRIVersion: "none"})
	return true
}
