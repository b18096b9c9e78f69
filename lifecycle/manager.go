// Package lifecycle is the pod lifecycle engine behind nftredird's API:
// it validates enrolments, keeps one durable record per pod in the state
// store, puts each pod's capture in place through a capture.Engine under
// the pod's lock (add, move, rollback, remove), reconciles records with
// the namespaces, and tells the node proxy, the node probe table and
// watchers what changed. It takes and returns the API's messages but knows
// nothing of gRPC: its errors carry a
// Kind, which the server maps to codes.
package lifecycle

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/podevents"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/state"
)

// DefaultReconcileWorkers is how many pods a reconcile pass checks at
// once: enough to overlap the namespaces' netlink round trips on a node of
// a few hundred pods, few enough not to crowd out AddPods.
const DefaultReconcileWorkers = 8

// Config is everything New needs. Zero values take the documented
// defaults where one exists.
type Config struct {
	// Engine opens and programs pod namespaces. Required; the daemon's is
	// capture.NewKernel.
	Engine capture.Engine
	// Store holds one record per enrolled pod. Required.
	Store *state.Store
	// RouteTable and RulePriority place the policy routing installed with
	// each pod; its fwmark rule matches Defaults.TProxyMark, the one mark
	// tproxied packets and their replies carry. Zero: the defaults of
	// netns.DefaultRouting.
	RouteTable, RulePriority int
	// Defaults supplies every option a request leaves unset (PodID and the
	// exclusion lists are ignored). Zero: nft.DefaultSpec.
	Defaults *nft.Spec
	// Logger is the engine's logger.
	Logger hclog.Logger
	// ReconcileWorkers bounds parallel reconcile work. Zero:
	// DefaultReconcileWorkers.
	ReconcileWorkers int
	// OnReconcile, when set, hears the outcome and duration of every
	// completed reconcile pass.
	OnReconcile func(ReconcileResult, time.Duration)
	// ZDS, when set, is told about every enrolment and release, so a node
	// proxy following ZDS (ztunnel) gets each pod's namespace. Leave it nil
	// to serve no ZDS: a nil *zds.Server in this field is not nil.
	ZDS ZDS
	// ZDSRequireAck makes AddPod wait for the node proxy's ack, and fail
	// with KindUnavailable (the pod staying enrolled) without one.
	ZDSRequireAck bool
	// Probe, when set, keeps the node's probe SNAT table true to the
	// enrolled pods' addresses. Nil: no node table.
	Probe ProbeTable
	// Policy, when set, decides which pods AddPod captures (Kubernetes
	// mode). Nil: every AddPod is captured as requested.
	Policy Policy
	// TeardownGrace is how long a namespace released with
	// namespace_teardown may keep the pod's capture before the daemon
	// removes it itself. Zero: DefaultTeardownGrace.
	TeardownGrace time.Duration
}

// Manager is the lifecycle engine.
type Manager struct {
	engine   capture.Engine
	store    *state.Store
	routing  netns.Routing
	defaults nft.Spec
	log      hclog.Logger
	workers  int

	onReconcile   func(ReconcileResult, time.Duration)
	zds           ZDS
	zdsRequireAck bool
	probe         ProbeTable
	// probeMu: see lockProbe.
	probeMu sync.RWMutex
	policy  Policy

	locks  *podLocks
	owners *owners
	watch  *podevents.Hub

	teardownGrace time.Duration
	// teardownMu protects the following fields: the one timer of the
	// cleanup of namespaces left for teardown, and when it fires.
	teardownMu      sync.Mutex
	teardownTimer   *time.Timer
	teardownDue     time.Time
	teardownStopped bool
}

// New checks cfg and loads the ownership index from the store. It does
// not reconcile; Reconcile does.
func New(cfg Config) (*Manager, error) {
	if cfg.Engine == nil {
		return nil, errors.New("lifecycle config: Engine is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("lifecycle config: Store is required")
	}
	if cfg.ZDSRequireAck && cfg.ZDS == nil {
		return nil, errors.New("lifecycle config: ZDSRequireAck without ZDS")
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
		return nil, fmt.Errorf("lifecycle config: defaults: %w", err)
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
		return nil, fmt.Errorf("lifecycle config: %w", err)
	}
	workers := cfg.ReconcileWorkers
	if workers <= 0 {
		workers = DefaultReconcileWorkers
	}
	grace := cfg.TeardownGrace
	if grace <= 0 {
		grace = DefaultTeardownGrace
	}
	m := &Manager{
		engine:        cfg.Engine,
		store:         cfg.Store,
		routing:       routing,
		defaults:      defaults,
		log:           log,
		workers:       workers,
		onReconcile:   cfg.OnReconcile,
		zds:           cfg.ZDS,
		zdsRequireAck: cfg.ZDSRequireAck,
		probe:         cfg.Probe,
		policy:        cfg.Policy,
		locks:         newPodLocks(),
		owners:        newOwners(),
		watch:         podevents.NewHub(),
		teardownGrace: grace,
	}
	records, err := cfg.Store.List()
	if err != nil {
		return nil, fmt.Errorf("load records: %w", err)
	}
	leftovers, err := cfg.Store.Leftovers()
	if err != nil {
		return nil, fmt.Errorf("load records left for teardown: %w", err)
	}
	m.owners.load(records, leftovers, log)
	log.Info("state loaded", "dir", cfg.Store.Dir(), "pods", len(records), "left_for_teardown", len(leftovers))
	return m, nil
}

// now is the timestamp for records: UTC, so records read the same on any
// node.
func (m *Manager) now() time.Time { return time.Now().UTC() }

// EnrolledPods counts the records, without reading them.
func (m *Manager) EnrolledPods() (int, error) { return m.store.Count() }

// Store is the state store the Manager keeps its records in.
func (m *Manager) Store() *state.Store { return m.store }

// Events is the hub the engine publishes pod events to.
func (m *Manager) Events() *podevents.Hub { return m.watch }

// CloseWatches ends every watch; later watches end at once. The server
// calls it when stopping, so that no watch holds up the shutdown.
func (m *Manager) CloseWatches() { m.watch.Close() }
