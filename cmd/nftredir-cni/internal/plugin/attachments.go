package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

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
// file name is unambiguous. The file is written before AddPod, so no
// record the daemon keeps for the plugin is without its file.
//
// Files must not outlive their attachment: the runtimes in use (podman,
// containerd, kubelet with libcni 1.1) never call GC. So every DEL that
// succeeds removes its file, and ADD now and then removes the files of
// attachments whose network namespace no longer exists (a sandbox whose
// DEL never came). The daemon drops its own record of such a pod when it
// finds the namespace gone, so nothing is left for GC to release.
//
// The files are replaced atomically but not fsynced. They describe network
// namespaces, which a power loss or reboot destroys along with the
// daemon's records on /run; a record lost that way names nothing that
// still exists, and the sweep removes one that survived. fsync would cost
// every pod start two disk flushes for nothing.

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
	if err := durable.Replace(s.path(a.Network, a.ContainerID, a.IfName), b); err != nil {
		return fmt.Errorf("write attachment record: %w", err)
	}
	return nil
}

// Delete removes the record; a missing one is fine.
func (s attachments) Delete(network, containerID, ifname string) error {
	if err := os.Remove(s.path(network, containerID, ifname)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove attachment record: %w", err)
	}
	return nil
}

// List returns the records of one network, or of every network when
// network is empty. A file that cannot be decoded is reported, not
// skipped, so that GC never mistakes an unreadable record for no record.
func (s attachments) List(network string) ([]Attachment, error) {
	return s.list(network, "")
}

// OfContainer returns the records of one container, on every network:
// the attachments of one sandbox, which share its container id. Only
// their files are read.
func (s attachments) OfContainer(containerID string) ([]Attachment, error) {
	return s.list("", containerID)
}

func (s attachments) list(network, containerID string) ([]Attachment, error) {
	nets := []string{network}
	if network == "" {
		var err error
		if nets, err = s.networks(); err != nil {
			return nil, err
		}
	}
	var out []Attachment
	var errs []error
	for _, n := range nets {
		dir := filepath.Join(s.dir, n)
		files, err := durable.ReadDir(dir, func(name string) bool {
			if containerID != "" {
				return strings.HasPrefix(name, containerID+":")
			}
			return strings.Contains(name, ":")
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("list attachment records: %w", err))
			continue
		}
		for _, f := range files {
			var a Attachment
			if err := json.Unmarshal(f.Data, &a); err != nil {
				errs = append(errs, fmt.Errorf("attachment record %s: %w", filepath.Join(dir, f.Name), err))
				continue
			}
			out = append(out, a)
		}
	}
	return out, errors.Join(errs...)
}

// networks lists the networks that have a directory of records.
func (s attachments) networks() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list attachment records: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// sweepMarker is the file whose modification time says when the last
// sweep started.
const sweepMarker = ".last-sweep"

// Sweep removes, at most once per interval (every call when interval is
// not positive), the records whose network namespace no longer exists,
// and the temporary files that a crashed write left. It returns how many
// files it removed; ran is false when the interval had not passed.
//
// A namespace path that is gone means the sandbox is gone: runtimes name
// each sandbox's namespace afresh, and a namespace that still exists is
// never swept, however old its record. Records that cannot be read are
// left for GC and an operator to see.
//
// keep is the attachment of the running ADD, whose namespace the daemon has
// just accepted; it is never removed.
func (s attachments) Sweep(now time.Time, interval time.Duration, keep Attachment) (removed int, ran bool, err error) {
	marker := filepath.Join(s.dir, sweepMarker)
	if fi, err := os.Stat(marker); err == nil && interval > 0 && now.Sub(fi.ModTime()) < interval && !fi.ModTime().After(now) {
		return 0, false, nil
	}
	// The marker is moved first, so that ADDs running at the same time do
	// not all sweep.
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return 0, true, fmt.Errorf("create attachment directory: %w", err)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return 0, true, fmt.Errorf("mark sweep: %w", err)
	}
	if err := os.Chtimes(marker, now, now); err != nil {
		return 0, true, fmt.Errorf("mark sweep: %w", err)
	}
	var errs []error
	nets, err := s.networks()
	errs = append(errs, err)
	for _, n := range nets {
		// A temporary file younger than a minute may be a write in
		// progress.
		k, err := durable.RemoveTemps(filepath.Join(s.dir, n), time.Minute, now)
		removed += k
		errs = append(errs, err)
	}
	all, err := s.List("")
	errs = append(errs, err)
	for _, a := range all {
		if a.Netns == "" || (a.Network == keep.Network && a.ContainerID == keep.ContainerID && a.IfName == keep.IfName) {
			continue
		}
		if _, err := os.Stat(a.Netns); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := s.Delete(a.Network, a.ContainerID, a.IfName); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, true, errors.Join(errs...)
}
