package kube

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/zds"
)

// The redirection annotation follows istio-cni's contract, which istiod
// and a returning istio-cni read:
//
//   - "enabled": the pod is captured and the node proxy has it (istiod
//     then sends it HBONE). Written once the proxy connected over ZDS
//     acked the pod; with no ZDS served (proxies on WatchPods, which has
//     no acks) as soon as the pod is captured. With ZDS served and no
//     proxy connected, a captured pod stays "pending" until a proxy
//     connects and acks it in its snapshot.
//   - "pending": captured, not yet acked. istiod does not treat the pod
//     as ambient; istio-cni, were it to come back, cleans such a pod up.
//   - absent: not captured.
//
// Only pods nftredir captured are annotated, and only their annotation is
// ever removed: marks (owned.go) remembers which, across restarts. An
// "enabled" annotation is never turned back to "pending" (a proxy that
// restarts re-acks every pod; istiod would otherwise flap), and a pod
// someone else annotated, istio-cni for one, is never touched.
const (
	redirectionEnabled = "enabled"
	redirectionPending = "pending"
)

// showCaptured annotates a pod nftredir captured; rec is its record, with
// the proxy's state when ZDS is served.
func (a *Agent) showCaptured(ctx context.Context, pod *corev1.Pod, rec *nftredirv1.Pod) error {
	if err := a.marks.put(string(pod.UID), podRef{pod.Namespace, pod.Name}); err != nil {
		return err
	}
	want := redirectionValue(rec)
	switch pod.Annotations[RedirectionAnnotation] {
	case want, redirectionEnabled:
		return nil
	}
	if want == redirectionPending && rec.GetEnrolledAt() != nil {
		// A pod just enrolled is usually acked within milliseconds, and
		// ProxyAcked queues it then: "pending" now would be a second API
		// write, next to the sandbox the runtime is still starting. Until
		// pendingGrace has passed, the pod only comes back later.
		if wait := pendingGrace - time.Since(rec.GetEnrolledAt().AsTime()); wait > 0 {
			a.queue.AddAfter(string(pod.UID), wait)
			return nil
		}
	}
	return a.patchRedirection(ctx, pod, want)
}

// pendingGrace is how long a newly enrolled pod the node proxy has not
// acked yet goes without the "pending" annotation. Without the annotation
// as with "pending", istiod does not treat the pod as ambient; the mark is
// written at once either way, so the annotation to come is known as
// nftredir's.
const pendingGrace = time.Second

// showIfCaptured annotates the pod if it is enrolled after all, after a
// failed AddPod: one of a pod captured before, that waited in vain for
// the proxy's ack (--zds-require-ack), leaves the pod captured, and
// "pending" says so.
func (a *Agent) showIfCaptured(ctx context.Context, pod *corev1.Pod) error {
	rec, err := a.enr.Enrolled(string(pod.UID))
	if err != nil || rec == nil {
		return err
	}
	return a.showCaptured(ctx, pod, rec)
}

// redirectionValue is what the annotation of a captured pod says: enabled
// once the proxy acked it, or when there is no ack to wait for.
func redirectionValue(rec *nftredirv1.Pod) string {
	if rec != nil && (rec.ZdsState == nil || rec.GetZdsState() == zds.StateAcked) {
		return redirectionEnabled
	}
	return redirectionPending
}

// showNotCaptured removes the annotation of a pod that is not captured,
// if nftredir wrote it; any other pod's annotation is left as it is.
func (a *Agent) showNotCaptured(ctx context.Context, pod *corev1.Pod) error {
	uid := string(pod.UID)
	if !a.marks.has(uid) {
		return nil
	}
	if _, ok := pod.Annotations[RedirectionAnnotation]; ok {
		if err := a.patchRedirection(ctx, pod, ""); err != nil {
			return err
		}
	}
	return a.marks.forget(uid)
}

// patchRedirection sets the annotation to value, or removes it for "",
// on pod (SetRedirection).
func (a *Agent) patchRedirection(ctx context.Context, pod *corev1.Pod, value string) error {
	_, err := SetRedirection(ctx, a.client, pod, value)
	return err
}

// SetRedirection sets pod's redirection annotation to value, or removes
// it for "". Like istio-cni, through the pods/status subresource: it may
// change the pod's metadata, and is the smaller grant. The patch carries
// the pod's uid, as the kubelet's status patches do: a pod of the same
// name that is another one by now (deleted and created again, as a
// StatefulSet's web-0 is, while the cache still held the first) is not
// the caller's to annotate, possibly not even on this node, and the API
// server refuses the change. A pod gone, or replaced so, is no error:
// written says whether the annotation was written.
func SetRedirection(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, value string) (written bool, err error) {
	annotation := "null"
	if value != "" {
		annotation = strconv.Quote(value)
	}
	patch := fmt.Sprintf(`{"metadata":{"uid":%q,"annotations":{%q:%s}}}`, pod.UID, RedirectionAnnotation, annotation)
	_, err = c.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err):
		// The uid did not match (refused as an immutable field, or by
		// the chart's node-scope policy, which sees the uid change), or
		// something else was wrong: only a look at the pod of that name
		// tells which.
		cur, gerr := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) || gerr == nil && cur.UID != pod.UID {
			return false, nil
		}
	}
	return false, fmt.Errorf("annotate pod %s/%s %s=%q: %w", pod.Namespace, pod.Name, RedirectionAnnotation, value, err)
}

// ProxyAcked queues the pod after the node proxy acked it over ZDS, so
// its annotation turns "enabled" (zds.Config.Acked). It does not block.
func (a *Agent) ProxyAcked(uid string) { a.queue.AddAfter(uid, afterSandbox) }

// warnIgnored shows the pod's ignored Istio annotations as a Warning
// Event: Istio only logs them, where the pod's owner does not look.
func (a *Agent) warnIgnored(pod *corev1.Pod) {
	for _, why := range IgnoredAnnotations(pod.Annotations) {
		a.events.Eventf(pod, corev1.EventTypeWarning, "AnnotationIgnored", "nftredir: %s", why)
	}
}
