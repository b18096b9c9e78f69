package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/cmd/nftredird/internal/metrics"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/health"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/nri"
	"github.com/nftredir/nftredir/probe"
	"github.com/nftredir/nftredir/server"
)

// observe wires the metrics into the daemon's parts: the apply timer
// around the applier, the call counter in front of the server's
// interceptors, and the lifecycle's reconcile hook. It returns nil,
// changing nothing, when --metrics-address is empty.
func observe(opts *options, cfg *server.Config, pcfg *lifecycle.Config, applier *nft.Applier, root hclog.Logger) *metrics.Metrics {
	if opts.metricsAddress == "" {
		return nil
	}
	m := metrics.New(root.Named("metrics"))
	*applier = m.Applier(*applier)
	cfg.UnaryInterceptors = append(cfg.UnaryInterceptors, m.UnaryInterceptor())
	cfg.StreamInterceptors = append(cfg.StreamInterceptors, m.StreamInterceptor())
	prev := pcfg.OnReconcile
	pcfg.OnReconcile = func(res lifecycle.ReconcileResult, d time.Duration) {
		if prev != nil {
			prev(res, d)
		}
		m.ObserveReconcile(res, d)
	}
	return m
}

// setSources points the scrape-time metrics at the lifecycle engine, the ZDS server,
// the node probe table, the Kubernetes agent and the readiness taint's remover
// (zs, pt, agent and u may be nil).
func setSources(m *metrics.Metrics, pods *lifecycle.Manager, zs *zdsServing, pt lifecycle.ProbeTable, agent *kube.Agent, u *kube.Untainter) {
	if m == nil {
		return
	}
	src := metrics.Sources{EnrolledPods: pods.EnrolledPods}
	if zs != nil {
		src.ZDS = zs.srv.Stats
	}
	if pm, ok := pt.(*probe.Manager); ok {
		src.ProbeAddresses = pm.Addresses
		src.ProbeRepairs = pm.Repairs
	}
	if u != nil {
		src.TaintRemovals = u.Removed
	}
	if agent != nil {
		src.Discovery = func() metrics.Discovery {
			d := agent.DiscoveryStats()
			return metrics.Discovery{Outcomes: d.Outcomes, Unproven: d.Unproven, Scans: d.Scans, ScanSeconds: d.ScanSeconds}
		}
	}
	m.SetSources(src)
}

// httpShutdownTimeout bounds the end of a scrape or probe in flight at
// exit.
const httpShutdownTimeout = 2 * time.Second

// readiness is what /readyz checks, and what the node's readiness taint
// waits for: the server's SERVING state (startup reconcile done, in
// Kubernetes mode the pods in line with the API, not stopping), in
// Kubernetes mode no selected pod left uncaptured for want of a proven
// namespace (agent, nil standalone), and every --ready-file (the CNI
// install step's, while the plugin is chained).
func readiness(opts *options, srv *server.Server, agent *kube.Agent, door *nri.Plugin) []health.Check {
	ready := []health.Check{
		{Name: "startup reconcile", Check: func(context.Context) error {
			if !srv.Ready() {
				return errors.New("not serving: reconciling recorded pods at startup, or stopping")
			}
			return nil
		}},
	}
	if agent != nil {
		ready = append(ready, health.Check{Name: "kubernetes pods captured", Check: func(context.Context) error {
			if missing := agent.Unproven(); len(missing) > 0 {
				return fmt.Errorf("%d pods to capture have no proven network namespace, their traffic is not captured: %s", len(missing), strings.Join(missing, ", "))
			}
			return nil
		}})
	}
	if door != nil {
		ready = append(ready, health.Check{Name: "nri", Check: func(context.Context) error {
			return nriReady(door.State(), opts.enrolment == defaults.EnrolmentAuto)
		}})
	}
	for _, f := range opts.readyFiles {
		ready = append(ready, health.FileExists(f))
	}
	return ready
}

// serveHTTP binds --metrics-address and serves /healthz, /readyz and
// /metrics until the returned stop is called. Liveness asks the daemon's
// own gRPC health service over its socket, so a daemon whose gRPC server
// no longer answers is restarted; readiness is ready (readiness). The
// kernel self-test has passed by the time this runs, or the daemon would
// have stopped.
//
// It returns the bound address ("" when --metrics-address is empty).
func serveHTTP(opts *options, ready []health.Check, m *metrics.Metrics, root hclog.Logger) (addr string, stop func(), err error) {
	if m == nil {
		return "", func() {}, nil
	}
	self, err := client.Dial(context.Background(), opts.socket, client.WithRetry(1, 0), client.WithTimeout(time.Second))
	if err != nil {
		return "", nil, err
	}
	h := health.NewHandler(health.Config{
		Liveness: []health.Check{{Name: "grpc", Check: func(ctx context.Context) error {
			// NOT_SERVING is alive: a long startup reconcile must not get
			// the daemon killed.
			_, err := self.Health(ctx)
			if err != nil {
				return fmt.Errorf("the gRPC server on %s does not answer: %w", opts.socket, err)
			}
			return nil
		}}},
		Readiness: ready,
		Metrics:   m.Handler(),
	})
	hs, err := health.Listen(opts.metricsAddress, h, root.Named("http"))
	if err != nil {
		self.Close()
		return "", nil, err
	}
	hs.Start()
	root.Info("serving health and metrics", "address", hs.Addr().String(), "ready_files", opts.readyFiles.String())
	return hs.Addr().String(), func() {
		hs.Shutdown(httpShutdownTimeout)
		self.Close()
	}, nil
}

// nriReady is readiness under NRI enrolment: the plugin registered with
// the runtime, whose validator then lets pods' containers start. With
// auto the node is ready either way: until the plugin registers with a
// runtime that holds pods back (the gate file), the install step keeps
// the CNI chain, the node's gate then, and the ready file says so.
func nriReady(s nri.State, auto bool) error {
	switch {
	case s.Registered || auto:
		return nil
	case s.Refused != "":
		return fmt.Errorf("NRI enrolment refused: %s; use --enrolment cni or auto", s.Refused)
	case s.Err != "":
		return fmt.Errorf("not registered with the runtime's NRI: %s", s.Err)
	}
	return errors.New("not registered with the runtime's NRI yet")
}
