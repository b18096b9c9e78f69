package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/netns"
)

// The Kubernetes agent's kinds. Version 0 of both is what nftredird wrote
// before its files had kinds (main 1a6b6e4 and earlier): sightings as
// snake_case JSON named <uid>.json, marks as the text "namespace/name"
// named <uid>.mark. openMemo migrates them.
const (
	sightingVersion  = 1
	annotatedVersion = 1
)

// Sighting is what the agent remembers of a pod sandbox it was told about
// through AddPod, captured or not: enough to enrol the pod later, if it
// gains the label, without scanning /proc for its namespace. The
// namespace identity is kept with the path: a path that names another
// namespace later is never enrolled.
type Sighting struct {
	Kind      Kind     `json:"kind"`
	Version   int      `json:"version"`
	PodUID    string   `json:"podUid"`
	Namespace string   `json:"podNamespace"`
	Name      string   `json:"podName"`
	NetnsPath string   `json:"netnsPath"`
	NetnsID   string   `json:"netnsId"`
	PodIPs    []string `json:"podIps,omitempty"`
	// Options are the caller's (the CNI configuration's) RedirectOptions,
	// protobuf-encoded: the base that pod annotations override.
	Options []byte    `json:"options,omitempty"`
	SeenAt  time.Time `json:"seenAt"`
}

func (s *Sighting) stamp() {
	s.Kind = KindSighting
	if s.Version == 0 {
		s.Version = sightingVersion
	}
}

func (s *Sighting) uid() string { return s.PodUID }

func (s *Sighting) check() error {
	if s.PodUID == "" {
		return errors.New("no pod uid")
	}
	_, err := netns.ParseID(s.NetnsID)
	return err
}

// SameSighting says whether two sightings describe the same sandbox,
// whenever they were seen.
func SameSighting(a, b *Sighting) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.NetnsPath == b.NetnsPath &&
		a.NetnsID == b.NetnsID && strings.Join(a.PodIPs, ",") == strings.Join(b.PodIPs, ",") &&
		bytes.Equal(a.Options, b.Options)
}

// upgradeSighting reads a version 0 sighting: the same fields under
// snake_case names.
func upgradeSighting(from int, data []byte, legacyUID string) ([]byte, error) {
	if from != 0 || legacyUID == "" {
		// Version 0 was only ever written under the uid's name.
		return nil, errors.New("not a sighting")
	}
	var old map[string]json.RawMessage
	if err := json.Unmarshal(data, &old); err != nil {
		return nil, err
	}
	v := map[string]any{"kind": KindSighting, "version": sightingVersion}
	for from, to := range map[string]string{
		"pod_uid": "podUid", "namespace": "podNamespace", "name": "podName",
		"netns_path": "netnsPath", "netns_id": "netnsId", "pod_ips": "podIps",
		"options": "options", "seen_at": "seenAt",
	} {
		if raw, ok := old[from]; ok {
			v[to] = raw
		}
	}
	return json.Marshal(v)
}

// Sightings are the agent's sightings, by pod.
type Sightings = Memo[Sighting, *Sighting]

// OpenSightings opens the directory of sightings. A sighting is only a
// hint for a later enrolment: losing one costs a scan of the runtime's
// pins (or the pod's next sandbox), never a wrong capture, so a damaged
// one is removed.
func OpenSightings(dir string, log hclog.Logger) (*Sightings, error) {
	return openMemo[Sighting](dir, KindSighting, ".json", SameSighting, log)
}

// Annotated says that a pod's redirection annotation is nftredir's to write
// and remove: nftredir captured the pod. A pod someone else annotated
// (istio-cni, before or beside nftredir) has none, and its annotation is
// never touched. A mark outlives the pod's record on purpose: a pod
// released while the API was unreachable keeps its mark until the
// annotation is gone, even across a restart of the daemon. It holds the
// pod's namespace and name, so that a mark whose pod the cache has not
// seen can still be checked against the API and dropped once the pod is
// gone.
type Annotated struct {
	Kind         Kind   `json:"kind"`
	Version      int    `json:"version"`
	PodUID       string `json:"podUid"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
}

func (m *Annotated) stamp() {
	m.Kind = KindAnnotated
	if m.Version == 0 {
		m.Version = annotatedVersion
	}
}

func (m *Annotated) uid() string { return m.PodUID }

func (m *Annotated) check() error { return defaults.CheckPodUID(m.PodUID) }

// upgradeAnnotated reads a version 0 mark: "namespace/name" under the uid's
// name. One without a readable name is still a mark: the pod's
// annotation stays nftredir's; only the lookup by name is lost.
func upgradeAnnotated(from int, data []byte, legacyUID string) ([]byte, error) {
	if from != 0 || legacyUID == "" {
		return nil, errors.New("not a mark")
	}
	ns, name, _ := strings.Cut(strings.TrimSpace(string(data)), "/")
	return json.Marshal(Annotated{Kind: KindAnnotated, Version: annotatedVersion, PodUID: legacyUID, PodNamespace: ns, PodName: name})
}

// AnnotatedPods are the agent's annotation marks, by pod.
type AnnotatedPods = Memo[Annotated, *Annotated]

// OpenAnnotated opens the directory of annotation marks. A damaged mark is
// quarantined, not dropped: it may be the only trace that an annotation
// is nftredir's to remove.
func OpenAnnotated(dir string, log hclog.Logger) (*AnnotatedPods, error) {
	return openMemo[Annotated](dir, KindAnnotated, ".mark", func(a, b *Annotated) bool {
		return a.PodUID == b.PodUID && a.PodNamespace == b.PodNamespace && a.PodName == b.PodName
	}, log)
}
