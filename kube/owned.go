package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/durable"
)

// marks is the durable set of pods whose redirection annotation is
// nftredir's to write and remove: pods it captured. A pod someone else
// annotated (istio-cni, before or beside nftredir) is not in it, and its
// annotation is never touched. The set outlives the capture record on
// purpose: a pod released while the API was unreachable keeps its mark
// until the annotation is gone, even across a restart of the daemon.
//
// One small file per pod in a directory of its own, holding the pod's
// namespace and name, so that a mark whose pod the cache has not seen can
// still be checked against the API and dropped once the pod is gone.
type marks struct {
	dir string

	mu sync.Mutex // protects byUID
	// byUID mirrors the directory, so that the sync of a captured pod
	// does not write a file each time.
	byUID map[string]podRef
}

// podRef is a pod's namespace and name.
type podRef struct{ Namespace, Name string }

// marksDir is the marks' directory under the agent's Dir; markSuffix
// ends every mark's name, so that no UID ("." is one) names the directory
// itself.
const (
	marksDir   = "annotated"
	markSuffix = ".mark"
)

func (m *marks) path(uid string) string { return filepath.Join(m.dir, uid+markSuffix) }

func openMarks(dir string) (*marks, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("annotation marks directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("annotation marks directory: %w", err)
	}
	m := &marks{dir: dir, byUID: map[string]podRef{}}
	for _, e := range entries {
		// Temp files of an interrupted write do not end in the suffix.
		uid, ok := strings.CutSuffix(e.Name(), markSuffix)
		if !ok || !e.Type().IsRegular() || defaults.CheckPodUID(uid) != nil {
			continue
		}
		b, err := os.ReadFile(m.path(uid))
		if err != nil {
			return nil, fmt.Errorf("read annotation mark %s: %w", e.Name(), err)
		}
		// A mark without a readable name is still a mark: the pod's
		// annotation stays nftredir's; only the lookup by name is lost.
		ns, name, _ := strings.Cut(strings.TrimSpace(string(b)), "/")
		m.byUID[uid] = podRef{Namespace: ns, Name: name}
	}
	return m, nil
}

// has reports whether the pod's annotation is nftredir's.
func (m *marks) has(uid string) bool {
	_, ok := m.get(uid)
	return ok
}

func (m *marks) get(uid string) (podRef, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ref, ok := m.byUID[uid]
	return ref, ok
}

// put marks the pod's annotation as nftredir's, durably, before the
// annotation is written: a crash in between leaves a mark without an
// annotation, which removing an absent annotation clears.
func (m *marks) put(uid string, ref podRef) error {
	if err := defaults.CheckPodUID(uid); err != nil {
		return fmt.Errorf("mark pod %q: %w", uid, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.byUID[uid]; ok && old == ref {
		return nil
	}
	if err := durable.WriteFile(m.path(uid), []byte(ref.Namespace+"/"+ref.Name+"\n")); err != nil {
		return fmt.Errorf("mark pod %s as annotated by nftredir: %w", uid, err)
	}
	m.byUID[uid] = ref
	return nil
}

// forget drops the mark, once the annotation is removed or the pod is
// gone.
func (m *marks) forget(uid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byUID[uid]; !ok {
		return nil
	}
	if err := durable.Remove(m.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	delete(m.byUID, uid)
	return nil
}

func (m *marks) uids() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.byUID))
	for uid := range m.byUID {
		out = append(out, uid)
	}
	return out
}
