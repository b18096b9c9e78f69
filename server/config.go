// Package server is nftredird's gRPC service over the lifecycle engine:
// the socket's peer-credential allowlist, connection and watch limits,
// health and reflection, the readiness gate, the periodic reconcile, and
// the one mapping of the engine's errors to gRPC codes.
package server

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/nftredir/nftredir/lifecycle"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// DefaultReconcileInterval is how often every record is checked against
// its namespace: drift is repaired within it, at a cost of one netlink
// read per pod and pass.
const DefaultReconcileInterval = 30 * time.Second

// Config is everything New needs. Zero values take the documented
// defaults where one exists.
type Config struct {
	// Pods is the lifecycle engine the API serves. Required.
	Pods *lifecycle.Manager
	// Logger is the server's logger; the daemon passes root.Named("server").
	Logger hclog.Logger
	// AllowUIDs and AllowGIDs may call the API besides root.
	AllowUIDs []uint32
	AllowGIDs []uint32
	// ReconcileInterval is the period of the background reconcile.
	// Zero: DefaultReconcileInterval. Negative: no periodic reconcile (startup only).
	ReconcileInterval time.Duration
	// Reflection registers gRPC server reflection, for grpcurl.
	Reflection bool
	// UnaryInterceptors and StreamInterceptors run outermost, before
	// logging and auth, so they see every call and its final code (the
	// daemon's call metrics).
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
	// Limits bound connections and watches; zero fields take defaults.
	Limits Limits
	// BeforeServing runs once after the startup reconcile and before
	// health turns SERVING; an error stops Run. The daemon starts serving
	// ZDS there, so a proxy's first snapshot is the reconciled set.
	BeforeServing func(context.Context) error
}

// Server implements nftredir.v1.RedirectService.
type Server struct {
	nftredirv1.UnimplementedRedirectServiceServer

	pods     *lifecycle.Manager
	log      hclog.Logger
	allow    allowList
	interval time.Duration
	reflect  bool

	unaryInterceptors  []grpc.UnaryServerInterceptor
	streamInterceptors []grpc.StreamServerInterceptor
	beforeServing      func(context.Context) error

	health *health.Server
	// conns and watchers count open API connections and WatchPods
	// streams against Config.Limits.
	conns, watchers *counter
	ready           atomic.Bool
}

// New checks cfg. It does not reconcile; Run does.
func New(cfg Config) (*Server, error) {
	if cfg.Pods == nil {
		return nil, errors.New("server config: Pods is required")
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	interval := cfg.ReconcileInterval
	if interval == 0 {
		interval = DefaultReconcileInterval
	}
	s := &Server{
		pods:          cfg.Pods,
		log:           log,
		allow:         newAllowList(cfg.AllowUIDs, cfg.AllowGIDs),
		interval:      interval,
		reflect:       cfg.Reflection,
		beforeServing: cfg.BeforeServing,
		health:        health.NewServer(),
	}
	limits := cfg.Limits.withDefaults()
	s.conns = newCounter(limits.MaxConnections, limits.MaxConnectionsPerUID)
	s.watchers = newCounter(limits.MaxWatchers, limits.MaxWatchersPerUID)
	s.unaryInterceptors, s.streamInterceptors = cfg.UnaryInterceptors, cfg.StreamInterceptors
	s.setServing(false)
	return s, nil
}

// Ready reports whether the server is SERVING: its startup reconcile (and
// BeforeServing) are done and it is not stopping.
func (s *Server) Ready() bool { return s.ready.Load() }
