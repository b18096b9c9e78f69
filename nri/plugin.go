// Package nri is nftredird's door for the container runtime's Node
// Resource Interface: the runtime tells the daemon, in process over its
// NRI socket, of every pod sandbox it starts and stops, and the daemon
// enrols and releases the pod as a CNI ADD and DEL of the same sandbox
// would, through the same lifecycle AddPod and RemovePod (and so the same
// enrolment policy: in Kubernetes mode, kube's, which applies
// internal/enrolment). Nothing is exec'd per pod, and no network
// configuration file has to keep a plugin chained.
//
// NRI is fail-open: a runtime starts a pod whose sandbox no plugin
// handled. What closes it is the runtime's own validator, which rejects a
// container while a required plugin is not registered (Gate); this
// package refuses to register with a runtime that has none, and registers
// with one that has only once every pod the runtime lists is brought in
// line (Synchronize). docs/nri.md has the whole argument.
package nri

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/calltrace"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/lifecycle"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Pods is what the plugin needs of the lifecycle engine: the calls a CNI
// ADD and DEL end in, and what is enrolled. *lifecycle.Manager is one.
type Pods interface {
	AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error)
	RemovePod(ctx context.Context, req *nftredirv1.RemovePodRequest) (bool, error)
	Enrolled(uid string) (*nftredirv1.Pod, error)
}

var _ Pods = (*lifecycle.Manager)(nil)

// Config is everything New needs. Zero values take the defaults.
type Config struct {
	// Pods enrols and releases. Required.
	Pods Pods
	// Socket is the runtime's NRI socket. "": defaults.NRISocket.
	Socket string
	// Name and Index are what the plugin registers as: the runtime's
	// required plugins name it by Name. "": defaults.NRIPluginName and
	// defaults.NRIPluginIndex.
	Name, Index string
	// Logger is the plugin's logger.
	Logger hclog.Logger
	// SyncWorkers bounds the pods Synchronize enrols at once. Zero: 4.
	SyncWorkers int
	// OnChange, when set, hears every change of State. It must not block.
	OnChange func(State)
	// Delay holds every RunPodSandbox this long before it starts, ignoring
	// the runtime's deadline: the daemon sets it only in a build for
	// tests, to show what a handler slower than the runtime's request
	// timeout does to a pod.
	Delay time.Duration
	// ConfigureTimeout bounds a connection's wait for the runtime's
	// Configure once the runtime has accepted the registration. Zero:
	// the NRI library's registration timeout.
	ConfigureTimeout time.Duration
}

// State is where the plugin stands with the runtime.
type State struct {
	// Registered: the runtime has accepted the plugin (Synchronize
	// succeeded) and the connection is up; its validator lets pods'
	// containers start.
	Registered bool
	// Gate is what the runtime said of itself at the last connection;
	// nil before any.
	Gate *Gate
	// Refused, when set, is why the plugin will not register with this
	// runtime: NRI enrolment would be fail-open there.
	Refused string
	// Err is why the last connection ended or failed; "" while
	// registered.
	Err string
}

// Plugin is the NRI plugin; Run connects it. Its exported handler methods
// are the NRI events it subscribes to, called by the stub through the
// session of the connection they arrive on.
type Plugin struct {
	pods             Pods
	socket           string
	name             string
	index            string
	log              hclog.Logger
	workers          int
	onChange         func(State)
	delay            time.Duration
	configureTimeout time.Duration

	mu sync.Mutex
	// protects the following fields
	state State
	// requestTimeout is the runtime's, from the last Configure.
	requestTimeout time.Duration
	// current is the connection Run is on; nil between connections.
	current *session
}

// New makes the plugin; nothing connects before Run.
func New(cfg Config) (*Plugin, error) {
	if cfg.Pods == nil {
		return nil, errors.New("nri config: Pods is required")
	}
	p := &Plugin{
		pods:             cfg.Pods,
		socket:           cmp(cfg.Socket, defaults.NRISocket),
		name:             cmp(cfg.Name, defaults.NRIPluginName),
		index:            cmp(cfg.Index, defaults.NRIPluginIndex),
		log:              cfg.Logger,
		workers:          cfg.SyncWorkers,
		onChange:         cfg.OnChange,
		delay:            cfg.Delay,
		configureTimeout: cfg.ConfigureTimeout,
		requestTimeout:   api.DefaultPluginRequestTimeout,
	}
	if p.configureTimeout <= 0 {
		p.configureTimeout = stub.DefaultRegistrationTimeout
	}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	if p.workers <= 0 {
		p.workers = 4
	}
	return p, nil
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// State is where the plugin stands now.
func (p *Plugin) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

func (p *Plugin) update(f func(*State)) {
	p.mu.Lock()
	old := p.state
	f(&p.state)
	now := p.state
	p.mu.Unlock()
	if p.onChange != nil && !sameState(old, now) {
		p.onChange(now)
	}
}

func sameState(a, b State) bool {
	return a.Registered == b.Registered && a.Refused == b.Refused && a.Err == b.Err && (a.Gate == nil) == (b.Gate == nil) && (a.Gate == nil || *a.Gate == *b.Gate)
}

// events are the only NRI events the plugin takes: pod sandboxes, never
// containers, so that no container creation pays a round trip to it.
func events() api.EventMask {
	var m api.EventMask
	m.Set(api.Event_RUN_POD_SANDBOX, api.Event_STOP_POD_SANDBOX, api.Event_REMOVE_POD_SANDBOX)
	return m
}

// configure is the runtime's first call on a new connection: it names
// itself, and the plugin decides whether it may register at all. On a
// runtime whose validator cannot require it, registering would be
// fail-open: pods would start uncaptured whenever the daemon is away, so
// the plugin refuses, and the node keeps the CNI chain as its gate.
// nriVersion and requestTimeout are what the stub took from the same
// Configure request.
func (p *Plugin) configure(runtime, version, nriVersion string, requestTimeout time.Duration) (api.EventMask, error) {
	p.setRequestTimeout(requestTimeout)
	g := GateOf(runtime, version, nriVersion)
	ok, why := g.FailClosed()
	p.update(func(s *State) {
		s.Gate = &g
		s.Refused = ""
		if !ok {
			s.Refused = why
		}
	})
	if !ok {
		return 0, fmt.Errorf("nftredir does not register: %s", why)
	}
	p.log.Info("runtime connected", "gate", g.String())
	return events(), nil
}

// setRequestTimeout records the runtime's request timeout, which bounds
// each handler.
func (p *Plugin) setRequestTimeout(d time.Duration) {
	if d <= 0 {
		return
	}
	p.mu.Lock()
	p.requestTimeout = d
	p.mu.Unlock()
}

// answerBy bounds a handler's work so that its answer reaches the runtime
// before the runtime gives up on it: a runtime that times a plugin out
// disconnects it (and, on NRI before 0.12.4, lets the sandbox proceed).
// An error in time fails the sandbox cleanly and the kubelet retries.
func (p *Plugin) answerBy(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		p.mu.Lock()
		dl = time.Now().Add(p.requestTimeout)
		p.mu.Unlock()
	}
	margin := time.Until(dl) / 10
	margin = min(max(margin, 20*time.Millisecond), 250*time.Millisecond)
	return context.WithDeadline(ctx, dl.Add(-margin))
}

// RunPodSandbox enrols the pod of a sandbox the runtime has just started
// (its network set up, before any of its containers): as a CNI ADD would,
// through the same AddPod and policy. A pod the policy leaves alone gets
// nil at once; an error fails the sandbox, the runtime tears it down and
// the kubelet tries again.
//
// Each call is logged at info with its time and phases (calltrace), as
// the gRPC server logs an AddPod: where a pod's start spends the
// daemon's time is read from that line.
func (p *Plugin) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) (err error) {
	ctx, trace := calltrace.New(ctx)
	start := time.Now()
	defer p.recover("RunPodSandbox", &err)
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	ctx, cancel := p.answerBy(ctx)
	defer cancel()
	captured, err := p.enrol(ctx, pod)
	fields := append([]any{
		EventField, "RunPodSandbox", TimeField, calltrace.Millis(time.Since(start)),
		"pod", pod.GetUid(), "namespace", pod.GetNamespace(), "name", pod.GetName(), "captured", captured,
	}, trace.Fields()...)
	if err != nil {
		p.log.Warn("RunPodSandbox: pod not captured; the runtime fails its sandbox", append(fields, "error", err)...)
		return err
	}
	p.log.Info("RunPodSandbox", fields...)
	return nil
}

// The log fields of a handled event: its name, and its time in the
// handler in milliseconds (to the microsecond), beside the phases'
// (calltrace.FieldPrefix).
const (
	EventField = "nri.event"
	TimeField  = "nri.time_ms"
)

// enrol brings one sandbox's pod in line: nothing for a sandbox that is
// not a Kubernetes pod's or has no namespace of its own, nothing for a pod
// already enrolled through this very namespace (a CNI ADD of the same
// sandbox did it, when both doors are open), else AddPod. It reports
// whether the pod is captured.
func (p *Plugin) enrol(ctx context.Context, pod *api.PodSandbox) (bool, error) {
	req, skip := AddPodRequest(pod)
	if req == nil {
		p.log.Debug("sandbox left alone", "sandbox", pod.GetId(), "why", skip)
		return false, nil
	}
	rec, err := p.pods.Enrolled(req.GetPodUid())
	calltrace.Mark(ctx, "enrolled")
	if err == nil && rec != nil && rec.GetNetnsPath() == req.GetNetnsPath() {
		return true, nil
	}
	resp, err := p.pods.AddPod(ctx, req)
	if err != nil {
		return false, fmt.Errorf("nftredir cannot capture pod %s/%s: %s", req.GetPodNamespace(), req.GetPodName(), lifecycle.Classify(err).Error())
	}
	return resp.GetNotCapturedReason() == "", nil
}

// StopPodSandbox releases the pod as a CNI DEL of the sandbox would: the
// runtime stops the sandbox, then tears its network down. A pod enrolled
// through a newer sandbox since is left alone. The runtime only logs an
// error here.
func (p *Plugin) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) (err error) {
	defer p.recover("StopPodSandbox", &err)
	ctx, cancel := p.answerBy(ctx)
	defer cancel()
	return p.release(ctx, pod, "StopPodSandbox")
}

// RemovePodSandbox is StopPodSandbox's backstop: by now the runtime has
// normally removed the namespace, and with it whatever was captured.
func (p *Plugin) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) (err error) {
	defer p.recover("RemovePodSandbox", &err)
	ctx, cancel := p.answerBy(ctx)
	defer cancel()
	return p.release(ctx, pod, "RemovePodSandbox")
}

func (p *Plugin) release(ctx context.Context, pod *api.PodSandbox, event string) error {
	req := RemovePodRequest(pod)
	if req == nil {
		return nil
	}
	log := p.log.With("pod", req.GetPodUid(), "namespace", pod.GetNamespace(), "name", pod.GetName(), "netns", req.GetNetnsPath())
	existed, err := p.pods.RemovePod(ctx, req)
	switch {
	case err != nil && lifecycle.Classify(err).Kind == lifecycle.KindPrecondition:
		// Enrolled through another sandbox's namespace since: not this
		// sandbox's to release.
		log.Debug(event+": pod enrolled through another sandbox; left alone", "detail", err)
		return nil
	case err != nil:
		log.Warn(event+": cannot release the pod; reconcile releases it once its namespace is gone", "error", err)
		return fmt.Errorf("nftredir cannot release pod %s/%s: %s", pod.GetNamespace(), pod.GetName(), lifecycle.Classify(err).Error())
	case existed:
		log.Debug(event + ": pod released")
	}
	return nil
}

// Synchronize brings in line every pod sandbox the runtime holds (and
// their containers), the list it sends when the plugin connects: the
// runtime counts the plugin as registered, and lets containers pass its
// validator, only once this returns nil. So every pod the policy captures
// must be captured by then, above all the pods that started while the
// plugin was away, whose containers the validator has held back: a pod
// with no container yet that cannot be captured fails the whole call, and
// the plugin stays unregistered until it can be (Run tries again). A pod
// whose containers already run is a running pod like any other, which the
// policy agent keeps trying to enrol; it does not hold the node.
//
// The whole call must fit in one request timeout; it stops in time and
// fails if it does not, and the next connection goes on from there (pods
// enrolled through their namespace are not enrolled again).
func (p *Plugin) Synchronize(ctx context.Context, pods []*api.PodSandbox, containers []*api.Container) (_ []*api.ContainerUpdate, err error) {
	_, err = p.synchronize(ctx, pods, containers)
	return nil, err
}

// synchronize is Synchronize; it also reports how many pods are captured.
func (p *Plugin) synchronize(ctx context.Context, pods []*api.PodSandbox, containers []*api.Container) (captured int, err error) {
	defer p.recover("Synchronize", &err)
	ctx, cancel := p.answerBy(ctx)
	defer cancel()
	start := time.Now()
	running := map[string]bool{}
	for _, c := range containers {
		running[c.GetPodSandboxId()] = true
	}
	type outcome struct {
		pod      *api.PodSandbox
		captured bool
		err      error
	}
	out := make([]outcome, len(pods))
	sem := make(chan struct{}, p.workers)
	var wg sync.WaitGroup
	for i, pod := range pods {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			o := outcome{pod: pod}
			defer func() { out[i] = o; <-sem; wg.Done() }()
			defer p.recover("Synchronize", &o.err)
			o.captured, o.err = p.enrol(ctx, pod)
		}()
	}
	wg.Wait()
	var held []string
	for _, o := range out {
		switch {
		case o.err == nil:
			if o.captured {
				captured++
			}
		case running[o.pod.GetId()]:
			p.log.Warn("Synchronize: running pod not captured; the policy agent keeps trying", "pod", o.pod.GetUid(), "namespace", o.pod.GetNamespace(), "name", o.pod.GetName(), "error", o.err)
		default:
			held = append(held, fmt.Sprintf("%s/%s: %v", o.pod.GetNamespace(), o.pod.GetName(), o.err))
		}
	}
	if len(held) > 0 {
		err := fmt.Errorf("%d pods whose containers have not started cannot be captured, so nftredir stays unregistered and the runtime's validator holds every pod's containers back: %s", len(held), strings.Join(held, "; "))
		p.log.Error("Synchronize failed", "pods", len(pods), "took", time.Since(start), "error", err)
		return captured, err
	}
	return captured, nil
}

// recover turns a panic in a handler into its error: the daemon never
// dies of a runtime's request, and the runtime fails what it asked.
func (p *Plugin) recover(handler string, err *error) {
	if r := recover(); r != nil {
		p.log.Error("panic in NRI handler", "handler", handler, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		*err = fmt.Errorf("nftredir: internal error in %s", handler)
	}
}

// Shutdown is the runtime saying it stops; the connection closes next and
// Run connects again when it is back.
func (p *Plugin) Shutdown(context.Context) {
	p.log.Info("runtime shutting down")
}
