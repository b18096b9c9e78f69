package kube

import (
	"fmt"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/state"
)

// The agent keeps two kinds of the state store's records in its
// directory (Config.Dir), both by pod: sightings, the namespaces of pod
// sandboxes it was told about (so that a restarted daemon still knows
// its uncaptured pods' namespaces), and, under marksDir, the marks of
// the pods whose redirection annotation is its own (state.Annotated). These
// are the agent's names for the store's.

type sighting state.Sighting

// sightings are the agent's sightings: the store's records, and the ones
// a runtime's AddPod just made, which are written to disk after its
// answer (putLater). The agent reads both alike, so only a crash in the
// write's few milliseconds can lose one; a pod whose sighting is lost is
// found among the runtime's pins (discover.go), as a pod whose sandbox
// the daemon never saw.
type sightings struct {
	m   *state.Sightings
	log hclog.Logger

	// wmu orders the durable writes: each runs under it with the latest
	// intent for its pod, so a write never undoes a newer put or forget.
	wmu sync.Mutex
	// mu guards pending: by pod, the sighting put but not yet written,
	// or nil for a forget in progress (get then answers nil).
	mu      sync.Mutex
	pending map[string]*sighting
	// kick wakes the writer; idle is closed while nothing is pending.
	kick chan struct{}
	done chan struct{}
}

func openSightings(dir string, log hclog.Logger) (*sightings, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	m, err := state.OpenSightings(dir, log)
	if err != nil {
		return nil, err
	}
	s := &sightings{m: m, log: log, pending: map[string]*sighting{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go s.writer()
	return s, nil
}

// put records v durably before it returns; an unchanged sighting is not
// rewritten.
func (s *sightings) put(v sighting) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	delete(s.pending, v.PodUID)
	s.mu.Unlock()
	if err := s.m.Put(state.Sighting(v)); err != nil {
		return fmt.Errorf("remember pod %s's namespace: %w", v.PodUID, err)
	}
	return nil
}

// putLater records v at once for the agent and on disk soon after, off
// the AddPod's path: the runtime's answer does not wait for the file.
func (s *sightings) putLater(v sighting) {
	s.mu.Lock()
	s.pending[v.PodUID] = &v
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// writer writes the pending sightings until close.
func (s *sightings) writer() {
	for {
		select {
		case <-s.kick:
			s.flush()
		case <-s.done:
			return
		}
	}
}

// flush writes every pending sighting. A write that fails is logged and
// kept pending, for the next put or close to try again: the agent still
// has the sighting in memory.
func (s *sightings) flush() {
	s.mu.Lock()
	uids := make([]string, 0, len(s.pending))
	for uid, v := range s.pending {
		if v != nil {
			uids = append(uids, uid)
		}
	}
	s.mu.Unlock()
	for _, uid := range uids {
		s.wmu.Lock()
		s.mu.Lock()
		v := s.pending[uid]
		s.mu.Unlock()
		if v != nil {
			err := s.m.Put(state.Sighting(*v))
			s.mu.Lock()
			if err == nil && s.pending[uid] == v {
				delete(s.pending, uid)
			}
			s.mu.Unlock()
			if err != nil {
				s.log.Warn("cannot write the pod's namespace to disk; the agent keeps it in memory", "pod", uid, "error", err)
			}
		}
		s.wmu.Unlock()
	}
}

// close writes what is pending and stops the writer. The daemon calls
// it once no AddPod runs any more, so a clean stop loses no sighting.
func (s *sightings) close() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	s.flush()
}

func (s *sightings) get(uid string) *sighting {
	s.mu.Lock()
	if v, ok := s.pending[uid]; ok {
		s.mu.Unlock()
		if v == nil {
			return nil
		}
		c := *v
		return &c
	}
	s.mu.Unlock()
	return (*sighting)(s.m.Get(uid))
}

// forget removes the sighting, pending or written.
func (s *sightings) forget(uid string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	s.pending[uid] = nil
	s.mu.Unlock()
	err := s.m.Forget(uid)
	s.mu.Lock()
	if v, ok := s.pending[uid]; ok && v == nil {
		delete(s.pending, uid)
	}
	s.mu.Unlock()
	return err
}

func (s *sightings) uids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, uid := range s.m.UIDs() {
		if v, ok := s.pending[uid]; !ok || v != nil {
			out = append(out, uid)
		}
	}
	for uid, v := range s.pending {
		if v != nil && !slices.Contains(out, uid) {
			out = append(out, uid)
		}
	}
	return out
}

// podRef is a pod's namespace and name.
type podRef struct{ Namespace, Name string }

// marks is the durable set of pods whose redirection annotation is
// nftredir's to write and remove (state.Annotated says why it outlives the
// capture).
type marks struct{ m *state.AnnotatedPods }

// marksDir is the marks' directory under the agent's Dir.
const marksDir = "annotated"

func openMarks(dir string, log hclog.Logger) (*marks, error) {
	m, err := state.OpenAnnotated(dir, log)
	return &marks{m}, err
}

// has reports whether the pod's annotation is nftredir's.
func (m *marks) has(uid string) bool { return m.m.Get(uid) != nil }

func (m *marks) get(uid string) (podRef, bool) {
	v := m.m.Get(uid)
	if v == nil {
		return podRef{}, false
	}
	return podRef{v.PodNamespace, v.PodName}, true
}

// put marks the pod's annotation as nftredir's, durably, before the
// annotation is written: a crash in between leaves a mark without an
// annotation, which removing an absent annotation clears.
func (m *marks) put(uid string, ref podRef) error {
	if err := m.m.Put(state.Annotated{PodUID: uid, PodNamespace: ref.Namespace, PodName: ref.Name}); err != nil {
		return fmt.Errorf("mark pod %s as annotated by nftredir: %w", uid, err)
	}
	return nil
}

// forget drops the mark, once the annotation is removed or the pod is
// gone.
func (m *marks) forget(uid string) error { return m.m.Forget(uid) }
func (m *marks) uids() []string          { return m.m.UIDs() }
