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
// One empty file per pod in a directory of its own, so that knowing a pod
// is ours never depends on reading the pod back from the API.
type marks struct {
	dir string

	mu sync.Mutex // protects set
	// set mirrors the directory, so that the sync of a captured pod does
	// not write a file each time.
	set map[string]bool
}

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
	m := &marks{dir: dir, set: map[string]bool{}}
	for _, e := range entries {
		// Temp files of an interrupted write do not end in the suffix.
		uid, ok := strings.CutSuffix(e.Name(), markSuffix)
		if ok && e.Type().IsRegular() && defaults.CheckPodUID(uid) == nil {
			m.set[uid] = true
		}
	}
	return m, nil
}

// has reports whether the pod's annotation is nftredir's.
func (m *marks) has(uid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set[uid]
}

// put marks the pod's annotation as nftredir's, durably, before the
// annotation is written: a crash in between leaves a mark without an
// annotation, which removing an absent annotation clears.
func (m *marks) put(uid string) error {
	if err := defaults.CheckPodUID(uid); err != nil {
		return fmt.Errorf("mark pod %q: %w", uid, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.set[uid] {
		return nil
	}
	if err := durable.WriteFile(m.path(uid), nil); err != nil {
		return fmt.Errorf("mark pod %s as annotated by nftredir: %w", uid, err)
	}
	m.set[uid] = true
	return nil
}

// forget drops the mark, once the annotation is removed or the pod is
// gone.
func (m *marks) forget(uid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.set[uid] {
		return nil
	}
	if err := durable.Remove(m.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	delete(m.set, uid)
	return nil
}
