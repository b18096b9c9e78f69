package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nftredir/nftredir/internal/durable"
	"github.com/nftredir/nftredir/netns"
)

// A sighting is what the agent remembers of a pod sandbox it was told
// about through AddPod, captured or not: enough to enrol the pod later, if
// it gains the label, without scanning /proc for its namespace.
type sighting struct {
	PodUID    string   `json:"pod_uid"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	NetnsPath string   `json:"netns_path"`
	NetnsID   string   `json:"netns_id"`
	PodIPs    []string `json:"pod_ips,omitempty"`
	// Options are the caller's (the CNI configuration's) RedirectOptions,
	// protobuf-encoded: the base that pod annotations override.
	Options []byte    `json:"options,omitempty"`
	SeenAt  time.Time `json:"seen_at"`
}

// sightings keeps one small file per pod, written atomically, so that a
// restarted daemon still knows its uncaptured pods' namespaces. The
// namespace identity is kept with the path: a path that names another
// namespace later is never enrolled.
type sightings struct {
	dir string

	mu    sync.Mutex // protects byUID
	byUID map[string]*sighting
}

const sightingSuffix = ".json"

func openSightings(dir string) (*sightings, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("sightings directory %q is not absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sightings directory: %w", err)
	}
	s := &sightings{dir: dir, byUID: map[string]*sighting{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sightings directory: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, sightingSuffix) {
			continue // temp files of an interrupted write, or foreign
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read sighting %s: %w", name, err)
		}
		var v sighting
		if err := json.Unmarshal(b, &v); err != nil || v.PodUID+sightingSuffix != name {
			// Only a hint for a later enrolment: losing it costs a scan
			// of the runtime's pins (or the pod's next sandbox), never a
			// wrong capture.
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		if _, err := netns.ParseID(v.NetnsID); err != nil {
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		s.byUID[v.PodUID] = &v
	}
	return s, nil
}

func (s *sightings) path(uid string) string { return filepath.Join(s.dir, uid+sightingSuffix) }

// put records v durably; an unchanged sighting is not rewritten.
func (s *sightings) put(v sighting) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.byUID[v.PodUID]; old != nil && sameSighting(old, &v) {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := durable.WriteFile(s.path(v.PodUID), b); err != nil {
		return fmt.Errorf("remember pod %s's namespace: %w", v.PodUID, err)
	}
	s.byUID[v.PodUID] = &v
	return nil
}

func sameSighting(a, b *sighting) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.NetnsPath == b.NetnsPath &&
		a.NetnsID == b.NetnsID && strings.Join(a.PodIPs, ",") == strings.Join(b.PodIPs, ",") &&
		bytes.Equal(a.Options, b.Options)
}

func (s *sightings) get(uid string) *sighting {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.byUID[uid]; v != nil {
		c := *v
		return &c
	}
	return nil
}

func (s *sightings) forget(uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byUID[uid]; !ok {
		return nil
	}
	if err := durable.Remove(s.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	delete(s.byUID, uid)
	return nil
}

func (s *sightings) uids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.byUID))
	for uid := range s.byUID {
		out = append(out, uid)
	}
	return out
}
