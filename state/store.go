// Package state is everything nftredird keeps on disk: records of one
// type in several kinds (file.go) — enrolled pods' intent, the leftovers
// of pods released into their namespace's teardown, the quarantine of
// records that cannot be used, and the Kubernetes agent's sightings and
// annotation marks (Memo) — written atomically and durably before the
// kernel or the API is touched.
package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/durable"
)

// Store keeps one record per enrolled pod in a directory. Each record is
// replaced atomically (temp file, fsync, rename, fsync of the directory),
// so after a crash of the daemon a record is either the old one or the
// new one, and one written before a reply is there when the daemon comes
// back. It lives exactly as long as its filesystem: the default
// directory is on tmpfs (/run), which a reboot empties together with the
// network namespaces the records describe; on a disk, a record written
// before a reply also survives a power loss.
//
// The store holds no lock of its own: callers serialise per pod, and
// records of different pods are different files.
type Store struct {
	dir string
	log hclog.Logger
}

// Open opens (creating if needed) the state directory and removes
// temp files left by writes that never completed, which were never
// acknowledged to anyone.
func Open(dir string, log hclog.Logger) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("state dir %q must be absolute", dir)
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if _, err := durable.RemoveTemps(dir, 0, time.Now()); err != nil {
		return nil, err
	}
	return &Store{dir: dir, log: log}, nil
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// Get returns the pod's record, or nil if there is none. A corrupt record
// is quarantined and reported as absent.
func (s *Store) Get(podUID string) (*Record, error) {
	name := fileName(podUID)
	path := filepath.Join(s.dir, name)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		// Not corruption: running out of fds, EINTR or EIO say nothing
		// about the record, and setting it aside would silently release
		// a pod whose capture stays in its namespace. The caller fails
		// and retries.
		return nil, fmt.Errorf("read record %s: %w", path, err)
	}
	r, err := decodeRecord(path, name, data)
	var ce *corruptError
	if errors.As(err, &ce) {
		s.quarantine(name, err)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// List returns every record. Corrupt ones are quarantined and skipped,
// ones of a newer format skipped; a directory or file that cannot be read
// is an error, so nothing is mistaken for a released pod.
func (s *Store) List() ([]*Record, error) {
	files, err := durable.ReadDir(s.dir, isRecordName)
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	out := make([]*Record, 0, len(files))
	for _, f := range files {
		r, err := decodeRecord(filepath.Join(s.dir, f.Name), f.Name, f.Data)
		var ce *corruptError
		var ne *NewerError
		switch {
		case errors.As(err, &ce):
			s.quarantine(f.Name, err)
		case errors.As(err, &ne):
			s.log.Warn("skipping a record this daemon cannot read", "error", err)
		case err != nil:
			return nil, err
		default:
			out = append(out, r)
		}
	}
	return out, nil
}

// Count counts the record files, without reading them.
func (s *Store) Count() (int, error) {
	names, err := durable.Names(s.dir, isRecordName)
	if err != nil {
		return 0, fmt.Errorf("read state dir: %w", err)
	}
	return len(names), nil
}

// decodeRecord checks a pod record's bytes as read, name being the file
// name it must be stored under.
func decodeRecord(path, name string, data []byte) (*Record, error) {
	var r Record
	if _, err := decode(KindPod, path, data, "", &r); err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, &corruptError{file: path, err: err}
	}
	if fileName(r.PodUID) != name {
		return nil, &corruptError{file: path, err: fmt.Errorf("record of pod %q is stored under the wrong name", r.PodUID)}
	}
	return &r, nil
}

// quarantine moves an unusable record aside so that it is reported once,
// kept for a person to inspect, and never acted on.
func (s *Store) quarantine(name string, cause error) {
	dst, err := setAside(s.dir, filepath.Join(s.dir, name), name, time.Now())
	switch {
	case err != nil:
		s.log.Error("cannot quarantine corrupt record; ignoring it", "file", filepath.Join(s.dir, name), "cause", cause, "error", err)
	case dst != "":
		s.log.Error("corrupt record moved to quarantine; the pod is no longer enrolled and its capture may remain in its namespace: RemovePod releases it, AddPod enrols it afresh", "file", dst, "cause", cause)
	}
}

// Put writes the record atomically and durably, stamped with its kind
// and, if it has none, the current version; r itself is left as it is.
func (s *Store) Put(r *Record) error {
	c := *r
	if err := write(filepath.Join(s.dir, fileName(r.PodUID)), &c); err != nil {
		return fmt.Errorf("write record of pod %s: %w", r.PodUID, err)
	}
	return nil
}

// Delete removes the pod's record durably; a missing record is fine.
func (s *Store) Delete(podUID string) error {
	if err := durable.Remove(filepath.Join(s.dir, fileName(podUID))); err != nil {
		return fmt.Errorf("delete record of pod %s: %w", podUID, err)
	}
	return nil
}

// RecordPath is the file that holds (or would hold) the pod's record.
func (s *Store) RecordPath(podUID string) string {
	return filepath.Join(s.dir, fileName(podUID))
}

// Newer lists the pod records, enrolled or left for teardown, that are of
// a newer format than this daemon reads: a newer daemon's, after a
// rollback. Their pods may still be captured, and only that daemon can
// release them.
func (s *Store) Newer() ([]string, error) {
	var out []string
	for _, dir := range []string{s.dir, filepath.Join(s.dir, TeardownDir)} {
		files, err := durable.ReadDir(dir, func(name string) bool {
			if dir == s.dir {
				return isRecordName(name)
			}
			_, _, ok := parseMoved(name)
			return ok
		})
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", dir, err)
		}
		for _, f := range files {
			name := f.Name
			if dir != s.dir {
				name, _, _ = parseMoved(f.Name)
			}
			var ne *NewerError
			if _, err := decodeRecord(filepath.Join(dir, f.Name), name, f.Data); errors.As(err, &ne) {
				out = append(out, filepath.Join(dir, f.Name))
			}
		}
	}
	return out, nil
}
