package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// DefaultReadinessTaint is the NoSchedule taint a node carries from its
// registration until nftredir is ready on it; the daemon removes it.
const DefaultReadinessTaint = "nftredir.io/agent-not-ready"

// ValidateTaintKey checks key as the API server would (a qualified name).
func ValidateTaintKey(key string) error {
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return fmt.Errorf("taint key %q: %v", key, errs)
	}
	return nil
}

// UntaintConfig is what an Untainter needs.
type UntaintConfig struct {
	Client kubernetes.Interface
	Node   string
	// Key is the taint's key; only its NoSchedule taints are removed.
	Key string
	// Ready returns nil once the node may take pods: the daemon serves,
	// its startup reconcile is done and the CNI plugin is chained.
	Ready  func(context.Context) error
	Logger hclog.Logger
	// Poll is how often Ready is asked. Zero: 500ms.
	Poll time.Duration
}

// Untainter removes the node's readiness taint once, when the node is
// ready for pods, and never puts it back: a taint added again while pods
// run would only keep new pods away, and the plugin already makes them
// wait for the daemon.
type Untainter struct {
	cfg     UntaintConfig
	log     hclog.Logger
	removed atomic.Int64
}

// NewUntainter checks cfg.
func NewUntainter(cfg UntaintConfig) (*Untainter, error) {
	if cfg.Client == nil || cfg.Node == "" || cfg.Ready == nil {
		return nil, errors.New("untaint config: Client, Node and Ready are required")
	}
	if err := ValidateTaintKey(cfg.Key); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	return &Untainter{cfg: cfg, log: cfg.Logger.With("node", cfg.Node, "taint", cfg.Key+":NoSchedule")}, nil
}

// Removed counts the taints this daemon removed (for the metric).
func (u *Untainter) Removed() int { return int(u.removed.Load()) }

// waitLogEvery spaces the "still waiting" lines.
const waitLogEvery = 30 * time.Second

// Run waits for Ready, then removes the taint, retrying API failures
// with backoff, until done or ctx ends.
func (u *Untainter) Run(ctx context.Context) {
	start := time.Now()
	var lastLog time.Time
	t := time.NewTicker(u.cfg.Poll)
	defer t.Stop()
	for {
		err := u.cfg.Ready(ctx)
		if err == nil {
			break
		}
		if time.Since(lastLog) >= waitLogEvery {
			u.log.Info("readiness taint kept until the node is ready for pods", "waiting_for", err.Error(), "waited", time.Since(start).Round(time.Second))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	pause := time.Second
	for {
		n, err := RemoveTaint(ctx, u.cfg.Client, u.cfg.Node, u.cfg.Key)
		if err == nil {
			if n > 0 {
				u.removed.Add(int64(n))
				u.log.Info("readiness taint removed: the node takes pods", "after", time.Since(start).Round(time.Millisecond))
				u.event(ctx)
			} else {
				u.log.Debug("node has no readiness taint")
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		hint := ""
		if apierrors.IsForbidden(err) {
			hint = "the ServiceAccount needs get and patch on nodes and, under the chart's node-scope admission policy, a token bound to a pod on this node (the in-cluster one)"
		}
		u.log.Warn("cannot remove the readiness taint; retrying", "error", err, "hint", hint, "retry_in", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// event records the removal on the Node, for kubectl describe node. It
// is written directly: a recorder's broadcaster sends in the background
// and this is the one event the untainter ever has.
func (u *Untainter) event(ctx context.Context) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: u.cfg.Node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: u.cfg.Node, UID: types.UID(u.cfg.Node)},
		Reason:         "ReadinessTaintRemoved",
		Message:        fmt.Sprintf("nftredir is ready on the node: taint %s:NoSchedule removed", u.cfg.Key),
		Type:           corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "nftredird", Host: u.cfg.Node},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if _, err := u.cfg.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		u.log.Debug("cannot record the event", "error", err)
	}
}

// removeAttempts bounds the read-test-remove rounds lost to concurrent
// writers of the node's taints (each loss is a 422 from the test op).
const removeAttempts = 10

// RemoveTaint removes every NoSchedule taint with key from node and
// returns how many it removed (0 when there was none). Each is removed by
// a JSON patch that first tests the taint is still at the index read, so
// a concurrent change of the list (another controller adding or removing
// a taint) fails the patch and the node is read again, rather than
// removing someone else's taint. It needs get and patch on nodes.
func RemoveTaint(ctx context.Context, client kubernetes.Interface, node, key string) (int, error) {
	removed := 0
	var lastErr error
	for attempt := 0; attempt < removeAttempts; attempt++ {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return removed, fmt.Errorf("read node %s: %w", node, err)
		}
		i := taintIndex(n.Spec.Taints, key)
		if i < 0 {
			return removed, nil
		}
		patch, err := removeTaintPatch(i, n.Spec.Taints[i])
		if err != nil {
			return removed, err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			removed++
			attempt = -1 // progress: the next taint of the key gets its own rounds
		case apierrors.IsInvalid(err) || apierrors.IsConflict(err):
			// The test op failed: the list changed since the read.
			lastErr = err
		default:
			return removed, fmt.Errorf("patch node %s: %w", node, err)
		}
	}
	return removed, fmt.Errorf("node %s: its taints kept changing under %d attempts: %w", node, removeAttempts, lastErr)
}

// taintIndex is the index of the first NoSchedule taint with key, or -1.
func taintIndex(taints []corev1.Taint, key string) int {
	for i, t := range taints {
		if t.Key == key && t.Effect == corev1.TaintEffectNoSchedule {
			return i
		}
	}
	return -1
}

// removeTaintPatch is the JSON patch (RFC 6902) that removes the taint at
// index i if, and only if, it is still taint.
func removeTaintPatch(i int, taint corev1.Taint) ([]byte, error) {
	path := "/spec/taints/" + strconv.Itoa(i)
	return json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": taint},
		{"op": "remove", "path": path},
	})
}
