package nri_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	nriruntime "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/nri"
	"github.com/nftredir/nftredir/state"
)

// The tests drive the plugin from the runtime's side with the NRI
// project's own runtime library, the one containerd and CRI-O embed
// (pkg/adaptation), over a real socket: registration, Configure,
// Synchronize and the pod events go over the wire as from a runtime, and
// the library's default validator decides whether a container may be
// created, as the runtime's does. Behind the plugin stand the real
// lifecycle engine and the real Kubernetes policy agent, on the capture
// engine's in-memory model (held to the kernel by capture/capturetest's
// contract suite) and client-go's fake API.

const node = "node-1"

// runtime is a container runtime's NRI side: the library, the sandboxes
// and containers it holds, and its default validator requiring the
// plugin.
type runtime struct {
	t      testing.TB
	r      *nriruntime.Adaptation
	socket string

	mu sync.Mutex
	// protects the following fields
	pods       []*api.PodSandbox
	containers []*api.Container
}

// startRuntime starts a runtime that says it is name at version, serving
// NRI on socket (a new one in a temporary directory when ""), holding
// running the pods of running (each with a container "app").
func startRuntime(t testing.TB, name, version, socket string, running ...*api.PodSandbox) *runtime {
	t.Helper()
	if socket == "" {
		socket = filepath.Join(t.TempDir(), "nri.sock")
	}
	rt := &runtime{t: t, socket: socket}
	sync := func(ctx context.Context, cb nriruntime.SyncCB) error {
		rt.mu.Lock()
		pods, ctrs := slices.Clone(rt.pods), slices.Clone(rt.containers)
		rt.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*nriruntime.ContainerUpdate) ([]*nriruntime.ContainerUpdate, error) {
		return nil, nil
	}
	dir := t.TempDir()
	r, err := nriruntime.New(name, version, sync, update,
		nriruntime.WithSocketPath(socket),
		nriruntime.WithPluginPath(filepath.Join(dir, "plugins")),
		nriruntime.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		nriruntime.WithDefaultValidator(&validator.DefaultValidatorConfig{
			Enable:                    true,
			RequiredPlugins:           []string{defaults.NRIPluginName},
			TolerateMissingAnnotation: defaults.NRITolerateAnnotation,
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	rt.r = r
	for _, p := range running {
		rt.hold(p, "app")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return rt
}

// stopPodSandbox and removePodSandbox are the runtime's hooks for a
// sandbox it stops and removes.
func (rt *runtime) stopPodSandbox(pod *api.PodSandbox) error {
	defer rt.r.BlockPluginSync().Unblock()
	return rt.r.StopPodSandbox(context.Background(), &api.StopPodSandboxRequest{Pod: pod})
}

func (rt *runtime) removePodSandbox(pod *api.PodSandbox) error {
	defer rt.r.BlockPluginSync().Unblock()
	return rt.r.RemovePodSandbox(context.Background(), &api.RemovePodSandboxRequest{Pod: pod})
}

// hold makes the runtime list pod (and its containers) from now on.
func (rt *runtime) hold(pod *api.PodSandbox, containers ...string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.pods = append(rt.pods, pod)
	for _, c := range containers {
		rt.containers = append(rt.containers, &api.Container{Id: pod.Id + "-" + c, PodSandboxId: pod.Id, Name: c, State: api.ContainerState_CONTAINER_RUNNING})
	}
}

// runPodSandbox is the runtime's RunPodSandbox hook for pod, once its
// network is up; a nil error lets the sandbox become ready. As in
// containerd, a plugin's Synchronize waits until the sandbox is either
// listed or has had its hook, never neither.
func (rt *runtime) runPodSandbox(pod *api.PodSandbox) error {
	defer rt.r.BlockPluginSync().Unblock()
	err := rt.r.RunPodSandbox(context.Background(), &api.RunPodSandboxRequest{Pod: pod})
	if err == nil {
		rt.hold(pod)
	}
	return err
}

// createContainer asks whether a container may be created in pod: the
// validator's answer. As in containerd, it waits for a plugin's
// registration under way.
func (rt *runtime) createContainer(pod *api.PodSandbox, name string) error {
	defer rt.r.BlockPluginSync().Unblock()
	_, err := rt.r.CreateContainer(context.Background(), &api.CreateContainerRequest{
		Pod:       pod,
		Container: &api.Container{Id: pod.Id + "-" + name, PodSandboxId: pod.Id, Name: name, State: api.ContainerState_CONTAINER_CREATED},
	})
	return err
}

// sandbox is a pod's sandbox as a runtime describes it to NRI.
func sandbox(ns, name string, ips ...string) *api.PodSandbox {
	uid := "uid-" + ns + "-" + name
	return &api.PodSandbox{
		Id:        "sb-" + ns + "-" + name,
		Uid:       uid,
		Name:      name,
		Namespace: ns,
		Ips:       ips,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{
			{Type: "ipc"},
			{Type: "network", Path: "/var/run/netns/cni-" + ns + "-" + name},
		}},
	}
}

// node is the daemon's side: the lifecycle engine on the in-memory
// capture engine, the Kubernetes policy agent over a fake API, and the
// plugin.
type daemon struct {
	engine *capturetest.Fake
	api    *fake.Clientset
	pods   *lifecycle.Manager
	plugin *nri.Plugin
	cancel context.CancelFunc
	done   chan struct{}
	// stop stops the daemon's parts; the test's cleanup does too.
	stop func()
}

// apiPod is a pod of the node as the API has it.
func apiPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + ns + "-" + name), Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// startDaemon starts the daemon's parts with the API holding objs: the
// namespace "mesh" labelled into the mesh and "plain" not, and every pod
// of objs; each sandbox's namespace exists on the node. The plugin is
// not connected yet (connect).
func startDaemon(t testing.TB, objs ...*corev1.Pod) *daemon {
	t.Helper()
	all := []k8sruntime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Labels: map[string]string{kube.DefaultModeLabel: kube.DefaultModeEnabled}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
	}
	d := &daemon{engine: capturetest.NewFake()}
	for _, p := range objs {
		all = append(all, p)
		d.engine.AddNamespace("/var/run/netns/cni-" + p.Namespace + "-" + p.Name)
	}
	d.api = fake.NewClientset(all...)
	log := testLog(t, "daemon")
	// Not t.TempDir: the agent's writer of sightings may finish a write
	// just after the test stopped it.
	stateDir, err := os.MkdirTemp("", "nri-test-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(stateDir) == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	store, err := state.Open(stateDir, log.Named("store"))
	if err != nil {
		t.Fatal(err)
	}
	agent, err := kube.New(kube.Config{Client: d.api, NodeName: node, Dir: state.AgentDir(stateDir), Sweep: time.Hour, Logger: log.Named("kube")})
	if err != nil {
		t.Fatal(err)
	}
	d.pods, err = lifecycle.New(lifecycle.Config{Engine: d.engine, Store: store, Policy: agent, Logger: log.Named("lifecycle")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			d.cancel()
			if d.done != nil {
				<-d.done
			}
			agent.Close()
		})
	}
	t.Cleanup(d.stop)
	if err := agent.Start(ctx, d.pods); err != nil {
		t.Fatal(err)
	}
	return d
}

// connect runs the plugin against rt's socket and returns the outcome of
// its first connection.
func (d *daemon) connect(t testing.TB, rt *runtime, mod func(*nri.Config)) error {
	t.Helper()
	cfg := nri.Config{
		Pods:   d.pods,
		Socket: rt.socket,
		Logger: testLog(t, "nri"),
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := nri.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.plugin = p
	first := make(chan error, 1)
	d.done = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	prev := d.cancel
	d.cancel = func() { cancel(); prev() }
	t.Cleanup(cancel)
	go func() {
		defer close(d.done)
		p.Run(ctx, first)
	}()
	select {
	case err := <-first:
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("the plugin's first connection neither registered nor failed in 15s")
	}
	return nil
}

// waitState waits for the plugin to reach a state cond accepts.
func (d *daemon) waitState(t *testing.T, what string, cond func(nri.State) bool) nri.State {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := d.plugin.State()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the plugin to be %s; it is %+v", what, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// enrolled reports whether the pod is enrolled, and through which path.
func (d *daemon) enrolled(t *testing.T, pod *api.PodSandbox) string {
	t.Helper()
	rec, err := d.pods.Enrolled(pod.Uid)
	if err != nil {
		t.Fatal(err)
	}
	return rec.GetNetnsPath()
}

// testLog is a logger writing to t's log until the test ends: the
// agent's and the plugin's goroutines may outlive it by a moment.
func testLog(t testing.TB, name string) hclog.Logger {
	if _, bench := t.(*testing.B); bench {
		return hclog.NewNullLogger()
	}
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: w})
}

type testWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(b), "\n"))
	}
	return len(b), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// sockProxy stands between the plugin and a runtime's socket, so that a
// test can do what a runtime's exit does to its plugins: drop their
// connections. The library's Stop leaves external plugins connected.
type sockProxy struct {
	t    *testing.T
	path string
	l    net.Listener

	mu sync.Mutex
	// protects the following fields
	backend string
	conns   []net.Conn
}

// newProxy listens on a new socket and forwards to backend.
func newProxy(t *testing.T, backend string) *sockProxy {
	t.Helper()
	p := &sockProxy{t: t, path: filepath.Join(t.TempDir(), "nri.sock"), backend: backend}
	l, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.l = l
	t.Cleanup(func() { l.Close(); p.drop("") })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			b, err := net.Dial("unix", p.backend)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

// drop closes every connection, as the runtime's exit would, and sends
// the next ones to backend ("": where they went).
func (p *sockProxy) drop(backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	if backend != "" {
		p.backend = backend
	}
}
