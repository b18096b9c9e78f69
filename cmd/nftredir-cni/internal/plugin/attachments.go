package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nftredir/nftredir/internal/durable"
)

// The daemon's records carry no CNI attachment (container id, ifname), and
// for Kubernetes pods the key is the pod UID, which says nothing about the
// attachment either. So the plugin keeps one small file per attachment it
// enrolled, <dataDir>/<network>/<containerID>:<ifname>, naming the key it
// used. That file is what lets
//   - DEL and CHECK find the pod under the key ADD used, even when the
//     runtime passes different CNI_ARGS on DEL;
//   - GC tell the pods this plugin enrolled (and through which attachment)
//     from those enrolled by anyone else, which it must never touch;
//   - DEL of a stale sandbox leave alone a pod that a newer sandbox (same
//     pod UID, new container id) has enrolled since.
// ':' can appear in neither a container id nor an interface name, so the
// file name is unambiguous. The file is written before AddPod and removed
// after a successful RemovePod, so no record the plugin made is ever
// without its file (short of someone deleting dataDir).

// Attachment is the plugin's record of one attachment it enrolled.
type Attachment struct {
	Network      string    `json:"network"`
	ContainerID  string    `json:"containerID"`
	IfName       string    `json:"ifname"`
	PodUID       string    `json:"podUid"`
	KeySource    KeySource `json:"keySource"`
	PodNamespace string    `json:"podNamespace,omitempty"`
	PodName      string    `json:"podName,omitempty"`
	Netns        string    `json:"netns"`
}

type attachments struct{ dir string }

func (s attachments) path(network, containerID, ifname string) string {
	return filepath.Join(s.dir, network, containerID+":"+ifname)
}

// Get returns the attachment's record, or nil when there is none.
func (s attachments) Get(network, containerID, ifname string) (*Attachment, error) {
	b, err := os.ReadFile(s.path(network, containerID, ifname))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read attachment record: %w", err)
	}
	var a Attachment
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("decode attachment record %s: %w", s.path(network, containerID, ifname), err)
	}
	return &a, nil
}

// Put writes the record atomically: a crash leaves the old file or the
// new one, never a torn one that DEL could not read.
func (s attachments) Put(a Attachment) error {
	dir := filepath.Join(s.dir, a.Network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create attachment directory: %w", err)
	}
	b, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode attachment record: %w", err)
	}
	if err := durable.WriteFile(s.path(a.Network, a.ContainerID, a.IfName), b); err != nil {
		return fmt.Errorf("write attachment record: %w", err)
	}
	return nil
}

// Delete removes the record; a missing one is fine.
func (s attachments) Delete(network, containerID, ifname string) error {
	if err := durable.Remove(s.path(network, containerID, ifname)); err != nil {
		return fmt.Errorf("remove attachment record: %w", err)
	}
	return nil
}

// List returns the records of one network, or of every network when
// network is empty. A file that cannot be decoded is reported, not
// skipped, so that GC never mistakes an unreadable record for no record.
func (s attachments) List(network string) ([]Attachment, error) {
	pattern := filepath.Join(s.dir, "*", "*:*")
	if network != "" {
		pattern = filepath.Join(s.dir, network, "*:*")
	}
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("list attachment records: %w", err)
	}
	var out []Attachment
	var errs []error
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), durable.TempPrefix) {
			continue // a write a crash interrupted; never acknowledged
		}
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed by a concurrent DEL of another container
		}
		var a Attachment
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("attachment record %s: %w", f, err))
			continue
		}
		out = append(out, a)
	}
	return out, errors.Join(errs...)
}
