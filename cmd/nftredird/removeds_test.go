package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestRemoveDaemonSetDeletesInTheForegroundAndWaits: the hook deletes
// with foreground propagation, so the DaemonSet outlives its pods, and
// returns only once the DaemonSet is gone.
func TestRemoveDaemonSetDeletesInTheForegroundAndWaits(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "nftredir-system", Name: "nftredir"}}
	c := fake.NewClientset(ds)
	// The API keeps the DaemonSet while its pods stop: three more reads
	// find it, as the garbage collector's foreground deletion does.
	stopping := 3
	var propagation metav1.DeletionPropagation
	c.PrependReactor("delete", "daemonsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p := a.(k8stesting.DeleteActionImpl).DeleteOptions.PropagationPolicy; p != nil {
			propagation = *p
		}
		return true, nil, nil
	})
	c.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if stopping > 0 {
			stopping--
			return true, ds, nil
		}
		return true, nil, apierrors.NewNotFound(appsv1.Resource("daemonsets"), "nftredir")
	})
	if err := removeDaemonSet(context.Background(), c, "nftredir-system", "nftredir", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if propagation != metav1.DeletePropagationForeground {
		t.Errorf("propagation %q; want Foreground, so the DaemonSet goes after its pods", propagation)
	}
	if stopping != 0 {
		t.Errorf("returned with the DaemonSet still there (%d reads left)", stopping)
	}
}

func TestRemoveDaemonSetAlreadyGone(t *testing.T) {
	if err := removeDaemonSet(context.Background(), fake.NewClientset(), "nftredir-system", "nftredir", time.Millisecond); err != nil {
		t.Errorf("a DaemonSet already gone: %v; want nil", err)
	}
}

// TestRemoveDaemonSetTimeoutIsAWarning: pods that do not stop in time do
// not fail the hook, which would stop helm uninstall.
func TestRemoveDaemonSetTimeoutIsAWarning(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "nftredir-system", Name: "nftredir"}}
	c := fake.NewClientset(ds)
	c.PrependReactor("delete", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := removeDaemonSet(ctx, c, "nftredir-system", "nftredir", time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pods that never stop: %v; want the deadline", err)
	}
}

func TestRemoveDaemonSetFlags(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{cmdRemoveDaemonSet, "--namespace", "nftredir-system"}, func(string) (string, bool) { return "", false }, &out); code != 2 || !strings.Contains(out.String(), "--name") {
		t.Errorf("without --name: exit %d, %q; want 2 naming --name", code, out.String())
	}
}
