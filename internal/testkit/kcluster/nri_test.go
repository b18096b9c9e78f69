package kcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nriRecorder is an NRI plugin that lets every pod through and records
// what the runtime told it.
type nriRecorder struct {
	mu    sync.Mutex
	syncs [][]string                 // the pods ("namespace/name") of each Synchronize
	ran   map[string]*api.PodSandbox // RunPodSandbox, by "namespace/name"
}

func (r *nriRecorder) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	names := make([]string, 0, len(pods))
	for _, p := range pods {
		names = append(names, p.GetNamespace()+"/"+p.GetName())
	}
	r.mu.Lock()
	r.syncs = append(r.syncs, names)
	r.mu.Unlock()
	return nil, nil
}

func (r *nriRecorder) RunPodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.mu.Lock()
	r.ran[p.GetNamespace()+"/"+p.GetName()] = p
	r.mu.Unlock()
	return nil
}

// synced reports whether a Synchronize after the first `after` listed
// every one of pods.
func (r *nriRecorder) synced(after int, pods ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.syncs[min(after, len(r.syncs)):] {
		if !slices.ContainsFunc(pods, func(p string) bool { return !slices.Contains(s, p) }) {
			return true
		}
	}
	return false
}

func (r *nriRecorder) syncCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.syncs)
}

func (r *nriRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("Synchronize calls %v, RunPodSandbox for %d pods", r.syncs, len(r.ran))
}

// connectNRIPlugin runs plugin on the cluster's NRI socket under name,
// connecting again whenever the connection ends (containerd restarts, or
// is not listening yet), until the returned stop is called or the test
// ends.
func connectNRIPlugin(t *testing.T, c *Cluster, name string, plugin any) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			s, err := stub.New(plugin, stub.WithPluginName(name), stub.WithPluginIdx("50"),
				stub.WithSocketPath(c.NRISocket), stub.WithOnClose(func() {}))
			if err == nil {
				err = s.Run(ctx)
			}
			if ctx.Err() == nil {
				t.Logf("NRI plugin %s: connection ended (%v); connecting again", name, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// refusedByValidator reports whether the pod's container waits because
// containerd's validator refused to create it (the kubelet retries).
func refusedByValidator(plugin string) func(*corev1.Pod) bool {
	want := fmt.Sprintf("required plugin %q not present", plugin)
	return func(p *corev1.Pod) bool {
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason == "CreateContainerError" && strings.Contains(w.Message, want) {
				return true
			}
		}
		return false
	}
}

// The cluster's containerd serves NRI on NRISocket: with its validator
// requiring a plugin, a pod's sandbox runs but its containers are refused
// until the plugin connects; the plugin then sees the pods that exist
// (Synchronize) and each new sandbox with its network namespace and IP
// (RunPodSandbox), connects again after containerd restarts, and once it
// is gone, containers are refused again.
func TestNRI(t *testing.T) {
	const plugin = "kcluster-nri-test"
	c := Start(t, Options{NRI: NRIOptions{Validator: &NRIValidator{RequiredPlugins: []string{plugin}}}})
	const ns = "default"
	cri := c.CRI(t)

	c.CreatePod(t, c.StandinPod(t, ns, "early", 8080, "", "app", "-port", "8080"))
	c.WaitPod(t, ns, "early", DefaultTimeout, "refused by the NRI validator", refusedByValidator(plugin))
	sbs, err := cri.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.name": "early"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs.Items) != 1 {
		t.Fatalf("pod early has %d ready sandboxes, want 1: %v", len(sbs.Items), sbs.Items)
	}
	ctrs, err := cri.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sbs.Items[0].Id}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ctrs.Containers) != 0 {
		t.Fatalf("the validator let pod early's sandbox get containers: %v", ctrs.Containers)
	}

	rec := &nriRecorder{ran: map[string]*api.PodSandbox{}}
	connected := time.Now()
	stop := connectNRIPlugin(t, c, plugin, rec)
	c.WaitPodReady(t, ns, "early")
	// How long a refused pod waits for the kubelet's next CreateContainer.
	t.Logf("pod early Ready %s after the plugin started connecting", time.Since(connected).Round(time.Millisecond))
	if !rec.synced(0, ns+"/early") {
		t.Errorf("no Synchronize listed pod early: %v", rec)
	}

	p := c.StandinPod(t, ns, "late", 8080, "", "app", "-port", "8080")
	c.CreatePod(t, p)
	p = c.WaitPodReady(t, ns, "late")
	rec.mu.Lock()
	sb := rec.ran[ns+"/late"]
	rec.mu.Unlock()
	if sb == nil {
		t.Fatal("the plugin saw no RunPodSandbox for pod late")
	}
	var netns string
	for _, n := range sb.GetLinux().GetNamespaces() {
		if n.GetType() == "network" {
			netns = n.GetPath()
		}
	}
	if !strings.HasPrefix(netns, "/var/run/netns/cni-") {
		t.Errorf("RunPodSandbox for pod late: network namespace %q, want /var/run/netns/cni-*", netns)
	}
	if !slices.Contains(sb.GetIps(), p.Status.PodIP) {
		t.Errorf("RunPodSandbox for pod late: IPs %v, want the pod's %s (set by CNI before the hook)", sb.GetIps(), p.Status.PodIP)
	}

	before := rec.syncCount()
	c.RestartContainerd(t)
	ctx, cancel := context.WithTimeout(t.Context(), DefaultTimeout)
	defer cancel()
	if err := c.waitUntil(ctx, "the NRI plugin to connect again after containerd's restart", func(context.Context) (bool, error) {
		return rec.synced(before, ns+"/early", ns+"/late"), nil
	}); err != nil {
		t.Fatalf("%v; %v", err, rec)
	}

	stop()
	c.CreatePod(t, c.StandinPod(t, ns, "orphan", 8080, "", "app", "-port", "8080"))
	c.WaitPod(t, ns, "orphan", DefaultTimeout, "refused by the NRI validator once the plugin is gone", refusedByValidator(plugin))
	for _, name := range []string{"early", "late"} {
		if p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{}); err != nil || !PodReady(p) {
			t.Errorf("pod %s after containerd's restart and the plugin's exit: ready %v, err %v", name, err == nil && PodReady(p), err)
		}
	}
}
