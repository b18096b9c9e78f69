package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftredir/nftredir/kube"
)

// cmdRemoveDaemonSet is the command the chart's pre-delete hook runs.
// helm uninstall deletes the DaemonSet and, right after, the RBAC its pods
// use, without waiting for them to stop; a daemon that stops after that
// can release its captured pods but no longer take their redirection
// annotation off. Run first, this deletes the DaemonSet in the foreground
// (its pods go before it does) and returns once it is gone, while the
// RBAC still stands.
const cmdRemoveDaemonSet = "remove-daemonset"

// removeDaemonSetPoll is how often the command looks whether the
// DaemonSet is gone.
const removeDaemonSetPoll = 500 * time.Millisecond

// runRemoveDaemonSet is nftredird remove-daemonset. Waiting past
// --timeout is a warning, not a failure: a failed hook would stop the
// uninstall, and pods that stop late only keep their annotation, as they
// did without the hook.
func runRemoveDaemonSet(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nftredird "+cmdRemoveDaemonSet, flag.ContinueOnError)
	fs.SetOutput(stderr)
	namespace := fs.String("namespace", "", "the DaemonSet's `namespace`")
	name := fs.String("name", "", "the DaemonSet's `name`")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for its pods to stop")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig `path`; empty uses the pod's service account")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *namespace == "" || *name == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nftredird %s: give --namespace and --name, and nothing else\n", cmdRemoveDaemonSet)
		return 2
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "nftredird." + cmdRemoveDaemonSet, Output: stderr, JSONFormat: true, TimeFormat: time.RFC3339Nano})
	client, err := kube.NewClient(*kubeconfig, "nftredird/"+cmdRemoveDaemonSet)
	if err != nil {
		log.Error("cannot reach the Kubernetes API", "error", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	switch err := removeDaemonSet(ctx, client, *namespace, *name, removeDaemonSetPoll); {
	case errors.Is(err, context.DeadlineExceeded):
		log.Warn("the DaemonSet's pods are still stopping; the uninstall goes on, and a pod stopping after its RBAC is gone keeps its redirection annotation",
			"daemonset", *namespace+"/"+*name, "waited", time.Since(start).Round(time.Millisecond))
		return 0
	case err != nil:
		log.Error("cannot remove the DaemonSet", "daemonset", *namespace+"/"+*name, "error", err)
		return 1
	}
	log.Info("DaemonSet and its pods gone", "daemonset", *namespace+"/"+*name, "took", time.Since(start).Round(time.Millisecond))
	return 0
}

// removeDaemonSet deletes the DaemonSet with foreground propagation and
// waits until it is gone, which is when its pods have stopped. One
// already gone is not an error.
func removeDaemonSet(ctx context.Context, c kubernetes.Interface, namespace, name string, poll time.Duration) error {
	foreground := metav1.DeletePropagationForeground
	err := c.AppsV1().DaemonSets(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &foreground})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for {
		_, err := c.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		// Any other error may pass (an API server restarting); the
		// deadline bounds the wait either way.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}
