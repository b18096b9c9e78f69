// Package metrics is nftredird's Prometheus instrumentation. The packages
// doing the work know nothing of Prometheus: gauges and the ZDS counters
// are read at scrape time from functions the daemon hands over (Sources),
// and the few events worth a histogram or counter come in through small
// hooks: a gRPC interceptor, an Applier wrapper and the server's
// OnReconcile.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/version"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/zds"
)

const namespace = "nftredir"

// Sources are read at every scrape. A nil function leaves its metric out
// (no ZDS server, no node probe table); they may be set after New, but
// before the first scrape can arrive.
type Sources struct {
	// EnrolledPods counts the pods the daemon has records for.
	EnrolledPods func() (int, error)
	// ZDS returns the ZDS server's counters.
	ZDS func() zds.Stats
	// ProbeAddresses counts the addresses in the node probe table's sets.
	ProbeAddresses func() int
	// TaintRemovals counts the readiness taints the daemon removed from
	// its node (0 or 1 in a daemon's life).
	TaintRemovals func() int
	// ProbeRepairs counts the node probe table's repairs after someone
	// else changed it.
	ProbeRepairs func() int64
	// Discovery returns the Kubernetes agent's counters of running pods
	// whose namespace it looked for among the runtime's pins.
	Discovery func() Discovery
}

// Discovery are the counters of Kubernetes mode's search for running
// pods' namespaces.
type Discovery struct {
	// Outcomes counts pods looked for, by outcome.
	Outcomes map[string]uint64
	// Unproven counts selected pods whose namespace is not proven yet.
	Unproven int
	// Scans and ScanSeconds count pin scans and their total time.
	Scans       uint64
	ScanSeconds float64
}

// Metrics holds the daemon's registry and its instruments.
type Metrics struct {
	reg *prometheus.Registry
	log hclog.Logger

	mu  sync.Mutex
	src Sources

	applySeconds    prometheus.Histogram
	applyFailures   prometheus.Counter
	handled         *prometheus.CounterVec
	handlingSeconds *prometheus.HistogramVec
	reconcileSecs   prometheus.Histogram
	reconcilePods   *prometheus.CounterVec
	driftRepairs    prometheus.Counter
}

// New registers every metric, the Go runtime's and the process's included.
func New(log hclog.Logger) *Metrics {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		log: log,
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "pod_apply_duration_seconds",
			Help: "Time to program one pod's nftables table (AddPod and reconcile repairs), successful or not.",
			// An apply is a netlink batch: ~0.3 ms on an idle node, tens of
			// ms under contention; seconds means something is wrong.
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		applyFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "pod_apply_failures_total",
			Help: "Pod table applies the kernel refused or that failed.",
		}),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "grpc_server_handled_total",
			Help: "gRPC calls completed, by service, method and status code.",
		}, []string{"grpc_service", "grpc_method", "grpc_code"}),
		handlingSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "grpc_server_handling_seconds",
			Help:    "Time to complete a unary gRPC call, by service and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"grpc_service", "grpc_method"}),
		reconcileSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "reconcile_duration_seconds",
			Help:    "Time of one reconcile pass over every record, the startup pass included.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60},
		}),
		driftRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "drift_repairs_total",
			Help: "Pods whose table or routing reconcile found drifted or missing, and re-applied.",
		}),
		reconcilePods: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "reconcile_pods_total",
			Help: "Pods checked by reconcile passes, by outcome: in_sync, repaired (drift repaired), dropped (namespace gone), failed, released (an interrupted RemovePod finished).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{"in_sync", "repaired", "dropped", "failed", "released"} {
		m.reconcilePods.WithLabelValues(o)
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "Always 1; the labels say which build is running.",
		ConstLabels: buildLabels(),
	})
	build.Set(1)
	m.reg.MustRegister(
		m.applySeconds, m.applyFailures, m.handled, m.handlingSeconds, m.reconcileSecs, m.reconcilePods, m.driftRepairs, build,
		&scrapeCollector{m: m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

func buildLabels() prometheus.Labels {
	v := version.Get()
	return prometheus.Labels{"version": v.Module, "revision": v.Revision, "goversion": v.Go}
}

// SetSources sets what the scrape-time metrics read.
func (m *Metrics) SetSources(s Sources) {
	m.mu.Lock()
	m.src = s
	m.mu.Unlock()
}

func (m *Metrics) sources() Sources {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.src
}

// Handler serves the registry in the Prometheus text (or OpenMetrics)
// format. A failing collector is logged and leaves its metric out; the
// rest are still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:            promLogger{m.log},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

// Registry is the registry, for tests and for adding metrics.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveReconcile is the server's OnReconcile.
func (m *Metrics) ObserveReconcile(res lifecycle.ReconcileResult, d time.Duration) {
	m.reconcileSecs.Observe(d.Seconds())
	m.reconcilePods.WithLabelValues("in_sync").Add(float64(res.InSync))
	m.reconcilePods.WithLabelValues("repaired").Add(float64(res.Repaired))
	m.driftRepairs.Add(float64(res.Repaired))
	m.reconcilePods.WithLabelValues("dropped").Add(float64(res.Dropped))
	m.reconcilePods.WithLabelValues("failed").Add(float64(res.Failed))
	m.reconcilePods.WithLabelValues("released").Add(float64(res.Released))
}

// UnaryInterceptor counts and times every unary call by its final code.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		svc, method := splitMethod(info.FullMethod)
		m.handled.WithLabelValues(svc, method, status.Code(err).String()).Inc()
		m.handlingSeconds.WithLabelValues(svc, method).Observe(time.Since(start).Seconds())
		return resp, err
	}
}

// StreamInterceptor counts every stream (WatchPods, health Watch) by its
// final code when it ends. Streams last for days, so they are not timed.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		svc, method := splitMethod(info.FullMethod)
		m.handled.WithLabelValues(svc, method, status.Code(err).String()).Inc()
		return err
	}
}

// splitMethod splits "/pkg.Service/Method".
func splitMethod(full string) (string, string) {
	if len(full) > 0 && full[0] == '/' {
		full = full[1:]
	}
	for i := len(full) - 1; i >= 0; i-- {
		if full[i] == '/' {
			return full[:i], full[i+1:]
		}
	}
	return "unknown", full
}

// Applier wraps a pod-table Applier to time its applies.
func (m *Metrics) Applier(a nft.Applier) nft.Applier { return &timedApplier{Applier: a, m: m} }

type timedApplier struct {
	nft.Applier
	m *Metrics
}

func (t *timedApplier) Apply(ctx context.Context, h *netns.Handle, rs *nft.Ruleset) error {
	start := time.Now()
	err := t.Applier.Apply(ctx, h, rs)
	t.m.applySeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		t.m.applyFailures.Inc()
	}
	return err
}

// TakeOver is an apply too (ours replaces another agent's capture in the
// same batch), timed and counted with the others.
func (t *timedApplier) TakeOver(ctx context.Context, h *netns.Handle, rs *nft.Ruleset, f *nft.Foreign) error {
	start := time.Now()
	err := t.Applier.TakeOver(ctx, h, rs, f)
	t.m.applySeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		t.m.applyFailures.Inc()
	}
	return err
}

// scrapeCollector reads the Sources at scrape time: the numbers live in
// the server, the ZDS server and the probe manager, and copying them into
// gauges on every change would put metrics calls on their hot paths.
type scrapeCollector struct{ m *Metrics }

var (
	podsDesc = prometheus.NewDesc(namespace+"_pods_enrolled",
		"Pods enrolled: records in the state directory.", nil, nil)
	zdsConnectedDesc = prometheus.NewDesc(namespace+"_zds_proxies_connected",
		"Node proxies connected over ZDS and past their hello.", nil, nil)
	zdsAcksDesc = prometheus.NewDesc(namespace+"_zds_acks_total",
		"ZDS messages the node proxy acknowledged.", nil, nil)
	zdsNacksDesc = prometheus.NewDesc(namespace+"_zds_nacks_total",
		"ZDS messages the node proxy refused (nack).", nil, nil)
	zdsAckTimeoutsDesc = prometheus.NewDesc(namespace+"_zds_ack_timeouts_total",
		"ZDS connections dropped because the proxy did not ack in time.", nil, nil)
	zdsProtocolErrorsDesc = prometheus.NewDesc(namespace+"_zds_protocol_errors_total",
		"ZDS connections dropped for a malformed or unexpected message.", nil, nil)
	probeDesc = prometheus.NewDesc(namespace+"_probe_table_addresses",
		"Pod addresses in the node probe table's sets.", nil, nil)
	taintDesc = prometheus.NewDesc(namespace+"_readiness_taint_removals_total",
		"Readiness taints (--readiness-taint) this daemon removed from its node once ready.", nil, nil)
	discoveriesDesc = prometheus.NewDesc(namespace+"_kube_netns_discoveries_total",
		"Running pods whose network namespace Kubernetes mode looked for among the runtime's pins, by outcome: proven (one namespace carries the pod's IP), not_found, ambiguous (several do; refused), no_pod_ip, scan_failed.", []string{"outcome"}, nil)
	unprovenDesc = prometheus.NewDesc(namespace+"_kube_pods_netns_unproven",
		"Pods the enrolment policy selects that are not enrolled because their network namespace could not be proven; retried.", nil, nil)
	pinScansDesc = prometheus.NewDesc(namespace+"_kube_pin_scans_total",
		"Scans of the runtime's network namespace pins.", nil, nil)
	probeRepairsDesc = prometheus.NewDesc(namespace+"_probe_table_repairs_total",
		"Times the node probe table (table, sets, chain or an enrolled pod's address) was found changed by someone else and restored.", nil, nil)
	pinScanSecondsDesc = prometheus.NewDesc(namespace+"_kube_pin_scan_seconds_total",
		"Time spent scanning the runtime's network namespace pins.", nil, nil)
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{podsDesc, zdsConnectedDesc, zdsAcksDesc, zdsNacksDesc, zdsAckTimeoutsDesc, zdsProtocolErrorsDesc, probeDesc, taintDesc, discoveriesDesc, unprovenDesc, pinScansDesc, pinScanSecondsDesc, probeRepairsDesc} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	src := c.m.sources()
	if src.EnrolledPods != nil {
		if n, err := src.EnrolledPods(); err != nil {
			ch <- prometheus.NewInvalidMetric(podsDesc, err)
		} else {
			ch <- prometheus.MustNewConstMetric(podsDesc, prometheus.GaugeValue, float64(n))
		}
	}
	if src.ZDS != nil {
		st := src.ZDS()
		ch <- prometheus.MustNewConstMetric(zdsConnectedDesc, prometheus.GaugeValue, float64(st.Connected))
		ch <- prometheus.MustNewConstMetric(zdsAcksDesc, prometheus.CounterValue, float64(st.Acks))
		ch <- prometheus.MustNewConstMetric(zdsNacksDesc, prometheus.CounterValue, float64(st.Nacks))
		ch <- prometheus.MustNewConstMetric(zdsAckTimeoutsDesc, prometheus.CounterValue, float64(st.AckTimeouts))
		ch <- prometheus.MustNewConstMetric(zdsProtocolErrorsDesc, prometheus.CounterValue, float64(st.ProtocolErrors))
	}
	if src.ProbeAddresses != nil {
		ch <- prometheus.MustNewConstMetric(probeDesc, prometheus.GaugeValue, float64(src.ProbeAddresses()))
	}
	if src.TaintRemovals != nil {
		ch <- prometheus.MustNewConstMetric(taintDesc, prometheus.CounterValue, float64(src.TaintRemovals()))
	}
	if src.ProbeRepairs != nil {
		ch <- prometheus.MustNewConstMetric(probeRepairsDesc, prometheus.CounterValue, float64(src.ProbeRepairs()))
	}
	if src.Discovery != nil {
		d := src.Discovery()
		for outcome, n := range d.Outcomes {
			ch <- prometheus.MustNewConstMetric(discoveriesDesc, prometheus.CounterValue, float64(n), outcome)
		}
		ch <- prometheus.MustNewConstMetric(unprovenDesc, prometheus.GaugeValue, float64(d.Unproven))
		ch <- prometheus.MustNewConstMetric(pinScansDesc, prometheus.CounterValue, float64(d.Scans))
		ch <- prometheus.MustNewConstMetric(pinScanSecondsDesc, prometheus.CounterValue, d.ScanSeconds)
	}
}

// promLogger routes promhttp's errors to the daemon's log.
type promLogger struct{ log hclog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn("metrics", "error", v) }
