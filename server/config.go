// Package server is nftredird's gRPC service: it validates requests, keeps
// one durable record per enrolled pod, programs pod namespaces through nft
// and netns under a per-pod lock, and reconciles records with the kernel.
package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Config is everything New needs. Zero values take the documented
// defaults where one exists.
type Config struct {
	// Guard opens and vets caller-supplied namespace paths. Required.
	Guard *netns.Guard
	// Applier programs rulesets. Required; nft.NewNetlink() in the daemon.
	Applier nft.Applier
	// StateDir holds one record per enrolled pod. Required, absolute.
	StateDir string
	// RouteTable and RulePriority place the policy routing installed with
	// each pod; its fwmark rule matches Defaults.TProxyMark, the one mark
	// tproxied packets and their replies carry. Zero: the defaults of
	// netns.DefaultRouting.
	RouteTable, RulePriority int
	// Defaults supplies every option a request leaves unset (PodID and the
	// exclusion lists are ignored). Zero: nft.DefaultSpec.
	Defaults *nft.Spec
	// Logger is the server's logger; the daemon passes root.Named("server").
	Logger hclog.Logger
	// AllowUIDs and AllowGIDs may call the API besides root.
	AllowUIDs []uint32
	AllowGIDs []uint32
	// ReconcileInterval is the period of the background reconcile.
	// Zero: 30s. Negative: no periodic reconcile (startup only).
	ReconcileInterval time.Duration
	// ReconcileWorkers bounds parallel reconcile work. Zero: 8.
	ReconcileWorkers int
	// Reflection registers gRPC server reflection, for grpcurl.
	Reflection bool
	// UnaryInterceptors and StreamInterceptors run outermost, before
	// logging and auth, so they see every call and its final code (the
	// daemon's call metrics).
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
	// OnReconcile, when set, hears the outcome and duration of every
	// completed reconcile pass, the startup one included.
	OnReconcile func(ReconcileResult, time.Duration)
	// ZDS, when set, is told about every enrolment and release, so a node
	// proxy following ZDS (ztunnel) gets each pod's namespace. Leave it nil
	// to serve no ZDS: a nil *zds.Server in this field is not nil.
	ZDS ZDS
	// ZDSRequireAck makes AddPod wait for the node proxy's ack, and fail
	// with Unavailable (the pod staying enrolled) without one.
	ZDSRequireAck bool
	// Probe, when set, keeps the node's probe SNAT table true to the
	// enrolled pods' addresses. Nil: no node table.
	Probe ProbeTable
	// Limits bound connections and watches; zero fields take defaults.
	Limits Limits
	// BeforeServing runs once after the startup reconcile and before
	// health turns SERVING; an error stops Run. The daemon starts serving
	// ZDS there, so a proxy's first snapshot is the reconciled set.
	BeforeServing func(context.Context) error
	// Policy, when set, decides which pods AddPod captures (Kubernetes
	// mode). Nil: every AddPod is captured as requested.
	Policy Policy
}

// Server implements nftredir.v1.RedirectService.
type Server struct {
	nftredirv1.UnimplementedRedirectServiceServer

	guard    *netns.Guard
	applier  nft.Applier
	store    *Store
	routing  netns.Routing
	defaults nft.Spec
	log      hclog.Logger
	allow    allowList
	interval time.Duration
	workers  int
	reflect  bool

	unaryInterceptors  []grpc.UnaryServerInterceptor
	streamInterceptors []grpc.StreamServerInterceptor
	onReconcile        func(ReconcileResult, time.Duration)

	zds           ZDS
	zdsRequireAck bool
	probe         ProbeTable
	// probeMu: see lockProbe.
	probeMu       sync.RWMutex
	beforeServing func(context.Context) error
	policy        Policy

	locks  *podLocks
	owners *owners
	watch  *broadcaster
	health *health.Server
	// conns and watchers count open API connections and WatchPods
	// streams against Config.Limits.
	conns, watchers *counter
	ready           atomic.Bool
}

// New checks cfg, opens the state store and loads the ownership index. It
// does not reconcile; Run (or a direct Reconcile) does.
func New(cfg Config) (*Server, error) {
	if cfg.Guard == nil {
		return nil, errors.New("server config: Guard is required")
	}
	if cfg.Applier == nil {
		return nil, errors.New("server config: Applier is required")
	}
	if cfg.ZDSRequireAck && cfg.ZDS == nil {
		return nil, errors.New("server config: ZDSRequireAck without ZDS")
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	defaults := nft.DefaultSpec("")
	if cfg.Defaults != nil {
		defaults = *cfg.Defaults
	}
	defaults.PodID = ""
	defaults.ExcludeInboundPorts, defaults.ExcludeOutboundPorts, defaults.ExcludeOutboundCIDRs = nil, nil, nil
	probe := defaults
	probe.PodID = "config-check"
	if err := probe.Validate(); err != nil {
		return nil, fmt.Errorf("server config: defaults: %w", err)
	}
	// The rule takes its mark from the spec: replies restored to the
	// tproxy mark must hit it, or inbound capture silently blackholes.
	routing := netns.DefaultRouting()
	routing.Mark, routing.Mask = defaults.TProxyMark.Value, defaults.TProxyMark.Mask
	if cfg.RouteTable != 0 {
		routing.Table = cfg.RouteTable
	}
	if cfg.RulePriority != 0 {
		routing.Priority = cfg.RulePriority
	}
	if err := routing.Validate(); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	store, err := OpenStore(cfg.StateDir, log.Named("store"))
	if err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	interval := cfg.ReconcileInterval
	if interval == 0 {
		interval = 30 * time.Second
	}
	workers := cfg.ReconcileWorkers
	if workers <= 0 {
		workers = 8
	}
	s := &Server{
		guard:         cfg.Guard,
		applier:       cfg.Applier,
		store:         store,
		routing:       routing,
		defaults:      defaults,
		log:           log,
		allow:         newAllowList(cfg.AllowUIDs, cfg.AllowGIDs),
		interval:      interval,
		workers:       workers,
		reflect:       cfg.Reflection,
		zds:           cfg.ZDS,
		zdsRequireAck: cfg.ZDSRequireAck,
		probe:         cfg.Probe,
		beforeServing: cfg.BeforeServing,
		policy:        cfg.Policy,
		locks:         newPodLocks(),
		owners:        newOwners(),
		watch:         newBroadcaster(),
		health:        health.NewServer(),
	}
	limits := cfg.Limits.withDefaults()
	s.conns = newCounter(limits.MaxConnections, limits.MaxConnectionsPerUID)
	s.watchers = newCounter(limits.MaxWatchers, limits.MaxWatchersPerUID)
	s.unaryInterceptors, s.streamInterceptors = cfg.UnaryInterceptors, cfg.StreamInterceptors
	s.onReconcile = cfg.OnReconcile
	records, err := store.List()
	if err != nil {
		return nil, fmt.Errorf("load records: %w", err)
	}
	s.owners.load(records, log)
	log.Info("state loaded", "dir", store.Dir(), "pods", len(records))
	s.setServing(false)
	return s, nil
}

// now is the timestamp for records: UTC, so records read the same on any
// node.
func (s *Server) now() time.Time { return time.Now().UTC() }

// Ready reports whether the server is SERVING: its startup reconcile (and
// BeforeServing) are done and it is not stopping.
func (s *Server) Ready() bool { return s.ready.Load() }

// EnrolledPods counts the records, without reading them.
func (s *Server) EnrolledPods() (int, error) { return s.store.Count() }
