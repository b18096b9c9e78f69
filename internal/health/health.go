// Package health serves nftredird's HTTP endpoints for kubelet and
// Prometheus on an address of their own: /healthz (liveness), /readyz
// (readiness) and /metrics. Each endpoint runs a list of named checks;
// readiness takes checks from anywhere (the server's startup reconcile, a
// file another container writes when the CNI plugin is installed), so the
// daemon wires them without this package knowing what they are.
package health

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Check is one named condition.
type Check struct {
	Name string
	// Check returns nil when the condition holds; its error is shown to
	// whoever probes. It must honour ctx.
	Check func(ctx context.Context) error
}

// Config is what a Handler serves.
type Config struct {
	// Liveness checks are /healthz: the process serves and is not wedged.
	// Keep them to what a restart would fix.
	Liveness []Check
	// Readiness checks are /readyz: the daemon can do its job now.
	Readiness []Check
	// Metrics is served at /metrics; nil serves none.
	Metrics http.Handler
	// CheckTimeout bounds each check. Zero: 1s, kubelet's default probe
	// timeout.
	CheckTimeout time.Duration
}

// Handler serves the endpoints.
type Handler struct {
	cfg Config
	mux *http.ServeMux
}

// NewHandler builds the Handler.
func NewHandler(cfg Config) *Handler {
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = time.Second
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { h.run(w, r, h.cfg.Liveness) })
	h.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) { h.run(w, r, h.cfg.Readiness) })
	if cfg.Metrics != nil {
		h.mux.Handle("GET /metrics", cfg.Metrics)
	}
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// run runs every check (all of them, so the body says everything that is
// wrong) and answers 200 when all pass, 503 otherwise. The body has one
// line per check, "ok NAME" or "FAIL NAME: why".
func (h *Handler) run(w http.ResponseWriter, r *http.Request, checks []Check) {
	var b strings.Builder
	failed := false
	for _, c := range checks {
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.CheckTimeout)
		err := c.Check(ctx)
		cancel()
		if err != nil {
			failed = true
			fmt.Fprintf(&b, "FAIL %s: %v\n", c.Name, err)
		} else {
			fmt.Fprintf(&b, "ok %s\n", c.Name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if failed {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(b.String()))
}

// Run runs checks in order and returns the first failure, named: for a
// caller that waits on the same conditions as a probe (the node's
// readiness taint waits on /readyz's).
func Run(ctx context.Context, checks []Check) error {
	for _, c := range checks {
		if err := c.Check(ctx); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	return nil
}

// FileExists is a readiness check that holds while path exists: another
// process (the CNI install step) creates it when its part is ready.
func FileExists(path string) Check {
	return Check{Name: "file " + path, Check: func(context.Context) error {
		_, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s does not exist yet", path)
		}
		return err
	}}
}

// Server is the HTTP server of the endpoints.
type Server struct {
	srv  *http.Server
	lis  net.Listener
	done chan error
	log  hclog.Logger
}

// Listen binds addr (host:port; ":15014" is every address of the node), so
// that a busy port is a startup error.
func Listen(addr string, h http.Handler, log hclog.Logger) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address: %w", err)
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Server{lis: lis, log: log, srv: &http.Server{
		Handler: h,
		// A probe or a scrape is one small GET: a client slower than this
		// is stuck or hostile, and each holds a goroutine and a socket.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}}, nil
}

// Addr is the bound address (the port chosen for ":0").
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Start serves in the background until Shutdown.
func (s *Server) Start() {
	s.done = make(chan error, 1)
	go func() {
		err := s.srv.Serve(s.lis)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			s.log.Error("metrics and health endpoints stopped serving", "error", err)
		}
		s.done <- err
	}()
}

// Shutdown stops accepting, lets requests in flight finish for up to
// timeout, then closes what is left.
func (s *Server) Shutdown(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	if s.done != nil {
		<-s.done
	} else {
		s.lis.Close()
	}
}
