package kube

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// TestUninstallReleasesEveryHeldPodAndKeepsWhatItCannot: an uninstall
// that releases captured pods releases the enrolled ones, the pod of a
// quarantined record and the pod of a namespace left for its teardown,
// and takes its annotation off each; a record of a newer format, whose pod
// only a newer daemon can release, keeps the state directory (and so the
// probe table) in place; once it is gone the directory goes.
func TestUninstallReleasesEveryHeldPodAndKeepsWhatItCannot(t *testing.T) {
	ctx := context.Background()
	stateDir := t.TempDir() + "/pods"
	store, err := state.Open(stateDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	engine := capturetest.NewFake()
	m, err := lifecycle.New(lifecycle.Config{Engine: engine, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for _, name := range []string{"enrolled", "quarantined", "leftover"} {
		path := "/run/netns/cni-" + name
		engine.AddNamespace(path)
		uid := "uid-" + name
		if _, err := m.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: uid, PodName: name, PodNamespace: "mesh", NetnsPath: path, PodIps: []string{"10.79.0.1"}}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mesh", UID: types.UID(uid), Annotations: map[string]string{RedirectionAnnotation: "enabled"}},
			Spec:       corev1.PodSpec{NodeName: "node-1"},
		})
	}
	// A torn write of the quarantined pod's record, set aside when read.
	path := store.RecordPath("uid-quarantined")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cut := strings.Index(string(data), `"netnsId"`)
	if err := os.WriteFile(path, data[:cut+strings.IndexByte(string(data[cut:]), '\n')+1], 0o600); err != nil {
		t.Fatal(err)
	}
	// The leftover pod's namespace was left for its teardown (a CNI DEL
	// with the hint), which did not come.
	if _, err := m.RemovePod(ctx, &nftredirv1.RemovePodRequest{PodUid: "uid-leftover", NamespaceTeardown: true}); err != nil {
		t.Fatal(err)
	}
	// A newer daemon's record, left after a rollback.
	newer := store.RecordPath("uid-newer")
	if err := os.WriteFile(newer, []byte(`{"kind":"pod","version":99,"podUid":"uid-newer"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	cs := fake.NewClientset(pods[0], pods[1], pods[2])
	a, err := New(Config{Client: cs, NodeName: "node-1", Dir: state.AgentDir(stateDir)})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if err := a.marks.put(string(p.UID), podRef{p.Namespace, p.Name}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := a.ReleaseAll(ctx, m)
	if err != nil || n != 3 {
		t.Fatalf("ReleaseAll = %d, %v; want 3 pods released", n, err)
	}
	for _, name := range []string{"enrolled", "quarantined", "leftover"} {
		path := "/run/netns/cni-" + name
		if rs, _ := engine.Table(path); rs != nil || !engine.Routing(path, netns.DefaultRouting()).Absent() {
			t.Errorf("%s: capture left after the uninstall:\n%s", name, engine.Dump(path))
		}
		p, err := cs.CoreV1().Pods("mesh").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := p.Annotations[RedirectionAnnotation]; ok {
			t.Errorf("%s still annotated %q", name, v)
		}
	}
	err = m.ClearState()
	if !errors.Is(err, lifecycle.ErrStateKept) || !strings.Contains(err.Error(), newer) {
		t.Fatalf("ClearState = %v; want the state kept for %s", err, newer)
	}
	if _, err := os.Stat(newer); err != nil {
		t.Fatalf("the newer daemon's record: %v", err)
	}
	if err := os.Remove(newer); err != nil {
		t.Fatal(err)
	}
	if err := m.ClearState(); err != nil {
		t.Fatalf("ClearState with nothing held: %v", err)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state directory still there: %v", err)
	}
}
