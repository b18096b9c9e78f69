package kube

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func taintedNode(taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Taints: taints}}
}

var (
	ours      = corev1.Taint{Key: DefaultReadinessTaint, Effect: corev1.TaintEffectNoSchedule}
	oursExec  = corev1.Taint{Key: DefaultReadinessTaint, Effect: corev1.TaintEffectNoExecute}
	someone   = corev1.Taint{Key: "example.com/gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
	someone2  = corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}
	oursValue = corev1.Taint{Key: DefaultReadinessTaint, Value: "x", Effect: corev1.TaintEffectNoSchedule}
)

// Only the key's NoSchedule taints go, whatever their value and place;
// the others stay in order.
func TestRemoveTaint(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []corev1.Taint
		want []corev1.Taint
		n    int
	}{
		{"only ours", []corev1.Taint{ours}, nil, 1},
		{"among others", []corev1.Taint{someone, ours, someone2}, []corev1.Taint{someone, someone2}, 1},
		{"twice, one with a value", []corev1.Taint{ours, someone, oursValue}, []corev1.Taint{someone}, 2},
		{"other effect kept", []corev1.Taint{oursExec, someone}, []corev1.Taint{oursExec, someone}, 0},
		{"none", nil, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(taintedNode(tc.in...))
			n, err := RemoveTaint(context.Background(), c, "n1", DefaultReadinessTaint)
			if err != nil || n != tc.n {
				t.Fatalf("RemoveTaint = %d, %v; want %d", n, err, tc.n)
			}
			node, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(node.Spec.Taints) != 0 || len(tc.want) != 0 {
				if !reflect.DeepEqual(node.Spec.Taints, tc.want) {
					t.Errorf("taints %v; want %v", node.Spec.Taints, tc.want)
				}
			}
		})
	}
	if _, err := RemoveTaint(context.Background(), fake.NewClientset(), "gone", DefaultReadinessTaint); err == nil {
		t.Error("RemoveTaint of a missing node succeeded")
	}
}

// The untainter waits for Ready, removes the taint once, counts it, and
// records an Event on the node.
func TestUntainterWaitsForReady(t *testing.T) {
	c := fake.NewClientset(taintedNode(ours, someone))
	var ready error = errors.New("CNI plugin not chained")
	readyC := make(chan error, 1)
	readyC <- ready
	u, err := NewUntainter(UntaintConfig{Client: c, Node: "n1", Key: DefaultReadinessTaint, Poll: 10 * time.Millisecond,
		Ready: func(context.Context) error {
			select {
			case e := <-readyC:
				ready = e
			default:
			}
			return ready
		}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { u.Run(context.Background()); close(done) }()
	time.Sleep(100 * time.Millisecond)
	node, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if len(node.Spec.Taints) != 2 || u.Removed() != 0 {
		t.Fatalf("taint removed before ready: %v (removed %d)", node.Spec.Taints, u.Removed())
	}
	readyC <- nil
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ready")
	}
	node, _ = c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if !reflect.DeepEqual(node.Spec.Taints, []corev1.Taint{someone}) || u.Removed() != 1 {
		t.Errorf("after ready: taints %v, removed %d; want [%v], 1", node.Spec.Taints, u.Removed(), someone)
	}
	evs, _ := c.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if len(evs.Items) != 1 || evs.Items[0].Reason != "ReadinessTaintRemoved" || evs.Items[0].InvolvedObject.Name != "n1" {
		t.Errorf("events %+v; want one ReadinessTaintRemoved on node n1", evs.Items)
	}
}

func TestUntaintConfigChecked(t *testing.T) {
	ok := func(context.Context) error { return nil }
	for _, cfg := range []UntaintConfig{
		{Client: fake.NewClientset(), Node: "n1", Key: "not a key!", Ready: ok},
		{Client: fake.NewClientset(), Node: "", Key: DefaultReadinessTaint, Ready: ok},
		{Client: fake.NewClientset(), Node: "n1", Key: DefaultReadinessTaint},
	} {
		if _, err := NewUntainter(cfg); err == nil {
			t.Errorf("NewUntainter(%+v) succeeded", cfg)
		}
	}
}
