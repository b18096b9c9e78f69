package kcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// DefaultTimeout bounds the waits of the helpers below.
const DefaultTimeout = 90 * time.Second

// StandinPod returns a pod running the standin image with args (e.g.
// "app", "-port", "8080", "-name", "web"), with a TCP readiness probe on
// readyPort (0: none) and a 1 s grace period. nodeName "" leaves placement
// to the scheduler.
func (c *Cluster) StandinPod(t testing.TB, namespace, name string, readyPort int32, nodeName string, args ...string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           c.Standin(t),
				ImagePullPolicy: corev1.PullNever,
				Args:            args,
			}},
		},
	}
	if readyPort != 0 {
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(readyPort)}},
			PeriodSeconds: 1,
		}
	}
	return p
}

// CreateNamespace creates a namespace with labels.
func (c *Cluster) CreateNamespace(t testing.TB, name string, labels map[string]string) *corev1.Namespace {
	t.Helper()
	ns, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return ns
}

// CreatePod creates the pod and returns it as the API stored it.
func (c *Cluster) CreatePod(t testing.TB, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := c.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return got
}

// WaitPod polls the pod until cond holds and returns it; the test fails
// after timeout, showing the pod's status and events.
func (c *Cluster) WaitPod(t testing.TB, namespace, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	var p *corev1.Pod
	err := c.waitUntil(ctx, fmt.Sprintf("pod %s/%s %s", namespace, name, what), func(ctx context.Context) (bool, error) {
		var err error
		p, err = c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describePod(namespace, name))
	}
	return p
}

// WaitPodReady waits until the pod is Ready.
func (c *Cluster) WaitPodReady(t testing.TB, namespace, name string) *corev1.Pod {
	t.Helper()
	return c.WaitPod(t, namespace, name, DefaultTimeout, "Ready", PodReady)
}

// PodReady reports the pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// DeletePod deletes the pod and waits until the API has no such pod: the
// kubelet has stopped it and its sandbox (CNI DEL included).
func (c *Cluster) DeletePod(t testing.TB, namespace, name string) {
	t.Helper()
	err := c.Client.CoreV1().Pods(namespace).Delete(t.Context(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s/%s: %v", namespace, name, err)
	}
	c.WaitPodGone(t, namespace, name)
}

// WaitPodGone waits until the API has no pod of that name.
func (c *Cluster) WaitPodGone(t testing.TB, namespace, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), DefaultTimeout)
	defer cancel()
	err := c.waitUntil(ctx, fmt.Sprintf("pod %s/%s to be gone", namespace, name), func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describePod(namespace, name))
	}
}

// PodLogs returns a container's log, read through the apiserver from the
// kubelet.
func (c *Cluster) PodLogs(t testing.TB, namespace, name, container string) string {
	t.Helper()
	b, err := c.Client.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{Container: container}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("logs of %s/%s %s: %v", namespace, name, container, err)
	}
	return string(b)
}

// PodEvents returns the events about a pod, oldest first.
func (c *Cluster) PodEvents(t testing.TB, namespace, name string) []corev1.Event {
	t.Helper()
	evs, err := c.events(t.Context(), namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func (c *Cluster) events(ctx context.Context, namespace, name string) ([]corev1.Event, error) {
	sel := fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.kind", "Pod"), fields.OneTermEqualSelector("involvedObject.name", name))
	l, err := c.Client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	evs := l.Items
	slices.SortFunc(evs, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	return evs, nil
}

// describePod is the pod's phase, conditions, container states and
// events, for failure messages.
func (c *Cluster) describePod(namespace, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(&b, "pod %s/%s: %v\n", namespace, name, err)
	} else {
		fmt.Fprintf(&b, "pod %s/%s: phase %s, node %q, IPs %v\n", namespace, name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIPs)
		for _, cond := range p.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s %s %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "  container %s: ready %v, restarts %d, state %+v\n", cs.Name, cs.Ready, cs.RestartCount, cs.State)
		}
	}
	evs, err := c.events(ctx, namespace, name)
	if err != nil {
		fmt.Fprintf(&b, "events: %v\n", err)
	}
	for _, e := range evs {
		fmt.Fprintf(&b, "  event %s %s (x%d): %s\n", e.Type, e.Reason, e.Count, e.Message)
	}
	return b.String()
}

// ServiceAccountToken mints a token for a ServiceAccount with the
// TokenRequest API, valid for an hour.
func (c *Cluster) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as the
// ServiceAccount (a token minted by ServiceAccountToken) to the apiserver
// at 127.0.0.1 of the node namespace, for a process run there
// (NodeCommand), and returns its path.
func (c *Cluster) ServiceAccountKubeconfig(t testing.TB, namespace, name string) string {
	t.Helper()
	tok := c.ServiceAccountToken(t, namespace, name)
	path := filepath.Join(c.Dir, fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name))
	if err := writeKubeconfig(path, c.APIServer, c.pki.caPEM, "system:serviceaccount:"+namespace+":"+name, nil, tok); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// WaitNodeReady waits until the node reports Ready and returns it.
func (c *Cluster) WaitNodeReady(t testing.TB) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), DefaultTimeout)
	defer cancel()
	var n *corev1.Node
	err := c.waitUntil(ctx, "node "+c.NodeName+" Ready", func(ctx context.Context) (bool, error) {
		var err error
		n, err = c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		return err == nil && nodeReady(n), err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
