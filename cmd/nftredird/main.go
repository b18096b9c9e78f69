// Command nftredird is the nftredir node daemon. See --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/cmd/internal/selftest"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/durable"
	"github.com/nftredir/nftredir/internal/health"
	"github.com/nftredir/nftredir/internal/peercred"
	"github.com/nftredir/nftredir/internal/podowner"
	"github.com/nftredir/nftredir/internal/version"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/netns/pins"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/nri"
	"github.com/nftredir/nftredir/probe"
	"github.com/nftredir/nftredir/server"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

func main() {
	tuneGC(os.LookupEnv)
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stderr))
}

// tuneGC trades a little memory for CPU. The daemon's live heap is a few
// MiB, so at Go's default GOGC it collects every few AddPods: GC was a
// fifth of AddPod's CPU. GOGC=300 under a 48 MiB soft limit cuts that
// while bounding the trade. GOGC and GOMEMLIMIT still override both.
func tuneGC(lookupEnv func(string) (string, bool)) {
	if _, set := lookupEnv("GOGC"); !set {
		debug.SetGCPercent(300)
	}
	if _, set := lookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(48 << 20)
	}
}

// run returns the exit code: 0 after a clean stop, 1 when the daemon
// could not start or failed, 2 for invalid flags.
func run(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) int {
	// Not the daemon: a client of the API with flags of its own.
	if len(args) > 0 && args[0] == cmdRemoveDaemonSet {
		return runRemoveDaemonSet(args[1:], stderr)
	}
	opts, err := parseFlags(args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nftredird: %v\nRun nftredird --help for the flags.\n", err)
		return 2
	}
	if opts.version {
		version.Print(os.Stdout, "nftredird")
		return 0
	}
	// A log reader that goes away must not kill the daemon: without
	// this, Go exits on SIGPIPE when a write to fd 2 fails with EPIPE.
	// Ignored, the write returns EPIPE and logWriter drops the line.
	signal.Ignore(syscall.SIGPIPE)
	out := newLogWriter(stderr, logQueueBytes, droppedNote(opts.logFormat == "json"))
	defer out.Close(logFlushTimeout)
	root := hclog.New(&hclog.LoggerOptions{
		Name:       "nftredird",
		Level:      opts.level,
		JSONFormat: opts.logFormat == "json",
		Output:     out,
		TimeFormat: time.RFC3339Nano,
	})
	if opts.command == cmdUninstall {
		if err := uninstall(opts, root); err != nil {
			root.Error("uninstall failed", "error", err)
			return 1
		}
		return 0
	}
	uninstalled, err := serve(opts, root)
	if err != nil {
		root.Error("exiting", "error", err)
		return 1
	}
	root.Info("stopped")
	if opts.cleanupOnExit || uninstalled {
		// After serve, whose deferred Close has sent what was queued.
		if err := uninstall(opts, root); err != nil {
			root.Error("cleanup on exit failed", "error", err)
			return 1
		}
	}
	return 0
}

// logFlushTimeout bounds the wait for the last log lines at exit.
const logFlushTimeout = 2 * time.Second

// uninstallTimeout bounds the uninstall command; deleting a table takes
// milliseconds unless the node is in trouble.
const uninstallTimeout = 30 * time.Second

// uninstall removes the node probe table and nothing else: pods' tables
// and records belong to pods, which their own RemovePod releases.
func uninstall(opts *options, root hclog.Logger) error {
	m, err := probe.New(probe.Config{NetnsPath: opts.nodeNetns, Logger: root.Named("probe")})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), uninstallTimeout)
	defer cancel()
	if err := m.Uninstall(ctx); err != nil {
		return err
	}
	root.Info("node probe table removed (or was not there)", "table", probe.TableName, "netns", nodeNetnsName(opts.nodeNetns))
	return nil
}

func nodeNetnsName(path string) string {
	if path == "" {
		return probe.SelfNetns
	}
	return path
}

// newProbe creates the node probe table, or repairs it, before anything is
// served: the startup reconcile then only fills its sets.
func newProbe(ctx context.Context, opts *options, root hclog.Logger) (*probe.Manager, error) {
	m, err := probe.New(probe.Config{
		NetnsPath:  opts.nodeNetns,
		KubeletUID: uint32(opts.kubeletUID),
		SourceV4:   opts.probeV4.Addr,
		SourceV6:   opts.probeV6.Addr,
		NoIPv4:     !opts.probeV4.IsValid(),
		NoIPv6:     !opts.probeV6.IsValid(),
		Logger:     root.Named("probe"),
	})
	if err != nil {
		return nil, fmt.Errorf("node probe table: %w", err)
	}
	if err := m.Ensure(ctx); err != nil {
		return nil, fmt.Errorf("node probe table: %w", err)
	}
	return m, nil
}

// serve runs the daemon. Start order: the guard; the kernel self-test;
// the state store; the node probe table; the lifecycle engine (loading
// records) and the server over it; the sockets; then, inside Run, the
// startup reconcile (which fills the probe sets), in Kubernetes mode the
// agent bringing pods in line with the API, ZDS serving (so a proxy's
// first snapshot is the reconciled set), systemd's READY=1, and health
// SERVING.
//
// It returns true when the stop was an uninstall that released every pod
// (the caller then removes the node probe table).
func serve(opts *options, root hclog.Logger) (uninstalled bool, err error) {
	protect := slices.Clone(opts.protectNetns)
	if opts.nodeNetns != "" {
		// A pod path naming the node must be refused like the daemon's
		// own namespace, whichever namespace the daemon runs in.
		protect = append(protect, opts.nodeNetns)
	}
	guard, err := netns.NewGuard(protect...)
	if err != nil {
		return false, fmt.Errorf("namespace guard: %w", err)
	}
	for _, w := range append(opts.warnings, guard.Warnings()...) {
		root.Warn(w)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := kernelSelfTest(ctx, opts, root); err != nil {
		return false, err
	}
	store, err := state.Open(opts.stateDir, root.Named("store"))
	if err != nil {
		return false, err
	}
	spec := opts.spec
	pcfg := lifecycle.Config{
		Store:         store,
		RouteTable:    opts.routing.Table,
		RulePriority:  opts.routing.Priority,
		Defaults:      &spec,
		Logger:        root.Named("lifecycle"),
		TeardownGrace: opts.teardownGrace,
	}
	cfg := server.Config{
		Logger:            root.Named("server"),
		AllowUIDs:         opts.allowUIDs,
		AllowGIDs:         opts.allowGIDs,
		ReconcileInterval: opts.reconcileInterval,
		Reflection:        opts.reflection,
	}
	if opts.probeSNAT {
		m, err := newProbe(ctx, opts, root)
		if err != nil {
			return false, err
		}
		// Deferred first, so it runs last: after Run has drained calls
		// that may still queue removals, send what is queued.
		defer func() {
			if err := m.Close(); err != nil {
				root.Warn("node probe table: pending changes not sent; the next start reconciles them", "error", err)
			}
		}()
		pcfg.Probe = m
	}
	applier := nft.Applier(nft.NewNetlink())
	met := observe(opts, &cfg, &pcfg, &applier, root)
	pcfg.Engine = capture.NewKernel(guard, applier, capture.TakeOverForeign(opts.takeOver))
	var kc *kubeConn
	if opts.kubernetes {
		// Before the agent opens its records: a daemon that kept them in
		// a directory of their own left them there.
		if _, err := state.AdoptAgentDir(opts.kubeStateDir, opts.stateDir, root.Named("store")); err != nil {
			return false, err
		}
		if kc, err = newKube(opts, guard, root); err != nil {
			return false, err
		}
		pcfg.Policy = kc.agent
	}
	var zs *zdsServing
	if opts.zdsSocket != "" {
		var acked func(string)
		if kc != nil {
			// A pod's annotation waits for the proxy's ack.
			acked = kc.agent.ProxyAcked
		}
		if zs, err = newZDS(opts, pcfg.Engine, store, acked, root); err != nil {
			return false, err
		}
		pcfg.ZDS, pcfg.ZDSRequireAck = zs.srv, opts.zdsRequireAck
	}
	pods, err := lifecycle.New(pcfg)
	if err != nil {
		return false, err
	}
	cfg.Pods = pods
	var door *nri.Plugin
	if kc != nil && opts.enrolment != defaults.EnrolmentCNI {
		nlog := root.Named("nri")
		door, err = nri.New(nri.Config{Pods: pods, Socket: opts.nriSocket, Logger: nlog, Delay: nriTestDelay(),
			OnChange: func(s nri.State) { noteGate(opts.nriGateFile, s, nlog) }})
		if err != nil {
			return false, err
		}
	}
	// In Kubernetes mode the pods are brought in line with the API before
	// SERVING, and before ZDS serves, so a proxy's first snapshot already
	// follows the policy.
	cfg.BeforeServing = func(ctx context.Context) error {
		if kc != nil {
			if err := kc.agent.Start(ctx, pods); err != nil {
				return fmt.Errorf("kubernetes: %w", err)
			}
		}
		if door != nil {
			connectNRI(ctx, door, opts, root)
		}
		if zs != nil {
			if err := zs.start(ctx); err != nil {
				return err
			}
		}
		notifyReady(root)
		return nil
	}
	srv, err := server.New(cfg)
	if err != nil {
		return false, err
	}
	if kc != nil && opts.podName != "" {
		// Past the signal: the DaemonSet's deletion may arrive after it.
		wctx, stopWatch := context.WithCancel(context.Background())
		defer stopWatch()
		klog := root.Named("kube")
		kc.watch = kc.owner.Watch(wctx, opts.podNamespace, opts.podName, func(msg string, kv ...any) { klog.Warn(msg, kv...) })
	}
	ready := readiness(opts, srv, kc.agentOrNil(), door)
	var untaint *kube.Untainter
	if kc != nil && opts.readinessTaint != "" {
		if untaint, err = kc.untainter(opts, ready, root); err != nil {
			return false, err
		}
		go untaint.Run(ctx)
	}
	setSources(met, pods, zs, pcfg.Probe, kc.agentOrNil(), untaint)
	lis, err := listenSocket(opts.socket, opts.socketGroup)
	if err != nil {
		return false, err
	}
	defer func() {
		// The listener unlinks on close too; this covers a listener
		// that never got closed by the gRPC server.
		if err := os.Remove(opts.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			root.Warn("cannot remove the socket", "socket", opts.socket, "error", err)
		}
	}()
	if zs != nil {
		if err := zs.srv.Listen(opts.zdsSocket); err != nil {
			lis.Close()
			return false, fmt.Errorf("zds: %w", err)
		}
		// After Run: calls still finishing during the graceful stop may be
		// waiting for a proxy's ack.
		defer zs.stop(root)
	}
	_, stopHTTP, err := serveHTTP(opts, ready, met, root)
	if err != nil {
		lis.Close()
		return false, err
	}
	// Deferred after the socket's removal, so it runs before it: once Run
	// has stopped gRPC, /readyz has been answering 503 all along the
	// graceful stop.
	defer stopHTTP()
	root.Info("listening", "socket", opts.socket, "state_dir", opts.stateDir, "allow_uids", opts.allowUIDs.String(), "allow_gids", opts.allowGIDs.String(), "socket_group", opts.socketGroup,
		"zds_socket", opts.zdsSocket, "kubernetes", opts.kubernetes, "node_name", opts.nodeName, "zds_require_ack", opts.zdsRequireAck, "zds_allow_uids", opts.zdsAllowUIDs.String(), "zds_allow_gids", opts.zdsAllowGIDs.String(), "zds_socket_group", opts.zdsSocketGroup, "probe_snat", opts.probeSNAT, "node_netns", nodeNetnsName(opts.nodeNetns), "kubelet_uid", uint32(opts.kubeletUID))
	err = srv.Run(ctx, lis, opts.shutdownTimeout)
	if kc != nil {
		// No AddPod runs any more: the sightings it made reach the disk.
		kc.agent.Close()
	}
	if err != nil {
		return false, err
	}
	if kc == nil || kc.watch == nil {
		return false, nil
	}
	// Before the deferred stops: releasing pods tells ztunnel over ZDS.
	return kc.uninstallIfDeleted(opts, pods, root.Named("uninstall")), nil
}

// nriFirstWait bounds how long the daemon waits for its first NRI
// registration before it serves ZDS anyway: the runtime's registration
// timeout (5s by default) and one Synchronize (2s) fit in it.
const nriFirstWait = 10 * time.Second

// connectNRI starts the plugin's connection to the runtime, which lasts
// until ctx ends, and waits for the first one's outcome: the pods the
// runtime started while the daemon was away are captured by its
// Synchronize, and ZDS, which serves next, then hands them to the node
// proxy in its first snapshot. A runtime that is not there, or refused,
// does not stop the daemon: the plugin keeps trying, and readiness says
// why it is not registered.
func connectNRI(ctx context.Context, door *nri.Plugin, opts *options, root hclog.Logger) {
	log := root.Named("nri")
	first := make(chan error, 1)
	go door.Run(ctx, first)
	select {
	case err := <-first:
		if err != nil {
			if s := door.State(); s.Refused != "" && opts.enrolment == defaults.EnrolmentAuto {
				log.Info("NRI enrolment not taken on this runtime; the CNI chain stays the gate", "why", s.Refused)
			} else {
				log.Warn("not registered with the runtime's NRI; retrying", "socket", opts.nriSocket, "error", err)
			}
			return
		}
		log.Info("registered with the runtime's NRI", "socket", opts.nriSocket, "gate", door.State().Gate.String())
	case <-time.After(nriFirstWait):
		log.Warn("no answer from the runtime's NRI yet; serving, and still trying", "socket", opts.nriSocket, "waited", nriFirstWait)
	case <-ctx.Done():
	}
}

// noteGate keeps the gate file true to the plugin's state for the CNI
// install step: written once the plugin is registered with a runtime
// whose validator holds pods back, removed once it refuses the runtime.
// A connection that merely ends leaves it: the validator holds pods back
// while the daemon is away, which is the gate.
func noteGate(path string, s nri.State, log hclog.Logger) {
	var err error
	switch {
	case s.Registered && s.Gate != nil && s.Gate.Validator:
		if _, serr := os.Stat(path); serr != nil {
			if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
				err = durable.WriteFile(path, []byte(s.Gate.String()+"\n"))
			}
		}
	case s.Refused != "":
		err = durable.Remove(path)
	}
	if err != nil {
		log.Warn("cannot update the NRI gate file; the CNI install step keeps its last door", "file", path, "error", err)
	}
}

// kernelSelfTest programs the rulesets this daemon would install into a
// scratch namespace before anything is served: on a kernel without one of
// their features the daemon stops, naming the module, rather than serve
// and fail every AddPod.
func kernelSelfTest(ctx context.Context, opts *options, root hclog.Logger) error {
	cfg := selftest.Config{Spec: opts.spec, Routing: opts.routing}
	if opts.probeSNAT {
		cfg.Probe = &probe.Spec{KubeletUID: uint32(opts.kubeletUID), SourceV4: opts.probeV4.Addr, SourceV6: opts.probeV6.Addr}
	}
	checks, err := selftest.Checks(cfg)
	if err != nil {
		return err
	}
	start := time.Now()
	results, err := selftest.Run(ctx, checks)
	log := root.Named("selftest")
	for _, r := range results {
		if r.Err != nil {
			log.Error("kernel check failed", "check", r.Name, "error", r.Err, "hint", r.Hint())
		} else {
			log.Debug("kernel check passed", "check", r.Name, "duration", r.Duration)
		}
	}
	if err != nil {
		return err
	}
	log.Info("kernel self-test passed", "checks", len(results), "duration", time.Since(start))
	return nil
}

// kubeConn is Kubernetes mode's connection to the API server.
type kubeConn struct {
	client kubernetes.Interface
	owner  *podowner.Client
	agent  *kube.Agent
	// watch follows the daemon's DaemonSet (with --pod-name).
	watch *podowner.Watcher
}

// newKube connects Kubernetes mode to the API server. Running pods the
// agent never saw a sandbox of are found among the runtime's pins through
// guard, the one that vets every path the daemon programs.
func newKube(opts *options, guard *netns.Guard, root hclog.Logger) (*kubeConn, error) {
	log := root.Named("kube")
	kube.RouteKlog(log.Named("client-go"))
	cfg, err := kube.RESTConfig(opts.kubeconfig, "nftredird/"+opts.nodeName)
	if err != nil {
		return nil, err
	}
	kc := &kubeConn{}
	if kc.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if kc.owner, err = kube.NewOwnerClient(cfg); err != nil {
		return nil, err
	}
	var scanner *pins.Scanner
	if len(opts.netnsDirs) > 0 {
		if scanner, err = pins.New(pins.Config{Guard: guard, Dirs: opts.netnsDirs, Logger: log.Named("pins")}); err != nil {
			return nil, err
		}
	}
	kc.agent, err = kube.New(kube.Config{
		Client:   kc.client,
		NodeName: opts.nodeName,
		Selector: opts.selector(),
		Dir:      state.AgentDir(opts.stateDir),
		Logger:   log,
		Pins:     scanner,
	})
	return kc, err
}

// agentOrNil is the agent, or nil outside Kubernetes mode.
func (kc *kubeConn) agentOrNil() *kube.Agent {
	if kc == nil {
		return nil
	}
	return kc.agent
}

func (kc *kubeConn) untainter(opts *options, ready []health.Check, root hclog.Logger) (*kube.Untainter, error) {
	return kube.NewUntainter(kube.UntaintConfig{
		Client: kc.client,
		Node:   opts.nodeName,
		Key:    opts.readinessTaint,
		Ready:  func(ctx context.Context) error { return health.Run(ctx, ready) },
		Logger: root.Named("kube").Named("taint"),
	})
}

// uninstallTimeBudget bounds what a stop spends on an uninstall: the
// DaemonSet's grace period is 30s, and the gRPC drain may have used 10.
const uninstallTimeBudget = 15 * time.Second

// uninstallIfDeleted asks whether the daemon's DaemonSet is being deleted
// and, if so and --uninstall-release-pods, releases every pod it may hold
// and removes the state directory, unless something in it may still stand
// for a captured pod that this daemon cannot release (lifecycle's
// ClearState). It returns whether the node probe table should go too:
// only when no captured pod is left, whose kubelet probes it keeps
// working. On any doubt it leaves everything: a stop that is not an
// uninstall must never release a pod.
func (kc *kubeConn) uninstallIfDeleted(opts *options, pods *lifecycle.Manager, log hclog.Logger) bool {
	ctx, cancel := context.WithTimeout(context.Background(), uninstallTimeBudget)
	defer cancel()
	v, why, err := kc.watch.Verdict(ctx)
	switch {
	case v != podowner.Deleted && err != nil:
		log.Warn("cannot tell whether the DaemonSet is being deleted; captured pods and the probe table stay", "error", err)
		return false
	case v != podowner.Deleted:
		log.Info("not an uninstall; captured pods and the probe table stay", "why", why)
		return false
	case !opts.uninstallReleasePods:
		log.Info("DaemonSet deleted: uninstalling, leaving captured pods, their records and the probe table (--uninstall-release-pods=false)", "why", why)
		return false
	}
	log.Info("DaemonSet deleted: uninstalling, releasing every captured pod", "why", why)
	n, err := kc.agent.ReleaseAll(ctx, pods)
	if err != nil {
		log.Error("some captured pods could not be released; their records and the probe table stay", "released", n, "error", err)
		return false
	}
	if err := pods.ClearState(); err != nil {
		// A pod this daemon could not release may still be captured, and
		// its kubelet probes need the node table.
		log.Error("captured pods released, but the state directory and the probe table stay", "dir", opts.stateDir, "released", n, "error", err)
		return false
	}
	log.Info("captured pods released, records removed", "released", n)
	return true
}

// zdsServing is the ZDS server and the goroutine serving it.
type zdsServing struct {
	srv    *zds.Server
	cancel context.CancelFunc
	ctx    context.Context
	// done is set by start, which the server calls from Run; stop is
	// deferred past Run, so it sees the write.
	done chan error
}

// newZDS opens namespaces through engine, the one the lifecycle uses, so
// the proxy is only ever handed what that engine vetted.
func newZDS(opts *options, engine capture.Engine, store *state.Store, acked func(uid string), root hclog.Logger) (*zdsServing, error) {
	srv, err := zds.NewServer(zds.Config{
		Pods:        zds.StorePods{Store: store},
		Opener:      engine,
		Acked:       acked,
		Logger:      root.Named("zds"),
		Allow:       peercred.NewAllowlist(opts.zdsAllowUIDs, opts.zdsAllowGIDs),
		SocketGroup: opts.zdsSocketGroup,
	})
	if err != nil {
		return nil, err
	}
	// Its own context rather than the signal's: the server is closed after
	// the gRPC server has drained, not when the signal arrives.
	ctx, cancel := context.WithCancel(context.Background())
	return &zdsServing{srv: srv, ctx: ctx, cancel: cancel}, nil
}

func (z *zdsServing) start(context.Context) error {
	z.done = make(chan error, 1)
	go func() { z.done <- z.srv.Serve(z.ctx) }()
	return nil
}

func (z *zdsServing) stop(log hclog.Logger) {
	z.cancel()
	if err := z.srv.Close(); err != nil {
		log.Warn("closing the ZDS socket", "error", err)
	}
	if z.done != nil {
		if err := <-z.done; err != nil {
			log.Warn("ZDS server", "error", err)
		}
	}
}
