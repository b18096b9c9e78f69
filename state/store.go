// Package state is nftredird's durable intent: one JSON record per
// enrolled pod in the state directory, written atomically and durably
// before the kernel is touched, and the quarantine that keeps a damaged
// record's pod releasable.
package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/durable"
)

// Store keeps one JSON record per pod in a directory. Each record is
// replaced atomically (temp file, fsync, rename, fsync of the directory),
// so after a crash a record is either the old one or the new one, and a
// record written before a reply survives power loss.
//
// The store holds no lock of its own: callers serialise per pod, and
// records of different pods are different files.
type Store struct {
	dir string
	log hclog.Logger
}

const (
	recordSuffix  = ".json"
	QuarantineDir = "quarantine"
)

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
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), durable.TempPrefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("remove stale temp file: %w", err)
			}
		}
	}
	return &Store{dir: dir, log: log}, nil
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// fileName derives the record's file name from the uid by hashing, so no
// uid, however odd, can name a path outside the directory or collide with
// the temp and quarantine names.
func fileName(podUID string) string {
	sum := sha256.Sum256([]byte(podUID))
	return hex.EncodeToString(sum[:]) + recordSuffix
}

func isRecordName(name string) bool {
	base, ok := strings.CutSuffix(name, recordSuffix)
	if !ok || len(base) != sha256.Size*2 {
		return false
	}
	_, err := hex.DecodeString(base)
	return err == nil && strings.ToLower(base) == base
}

// Get returns the pod's record, or nil if there is none. A corrupt record
// is quarantined and reported as absent.
func (s *Store) Get(podUID string) (*Record, error) {
	name := fileName(podUID)
	r, err := s.read(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
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
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	var out []*Record
	for _, e := range entries {
		if !e.Type().IsRegular() || !isRecordName(e.Name()) {
			continue
		}
		r, err := s.read(e.Name())
		var ce *corruptError
		var ne *NewerError
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Removed since ReadDir: released concurrently.
		case errors.As(err, &ce):
			s.quarantine(e.Name(), err)
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
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("read state dir: %w", err)
	}
	n := 0
	for _, e := range entries {
		if e.Type().IsRegular() && isRecordName(e.Name()) {
			n++
		}
	}
	return n, nil
}

// NewerError marks a record of a newer format than this daemon reads.
type NewerError struct {
	file    string
	version int
}

func (e *NewerError) Error() string {
	return fmt.Sprintf("record %s has format version %d; this nftredird reads up to %d: upgrade it", e.file, e.version, Version)
}

// corruptError marks a record that exists but cannot be used.
type corruptError struct {
	file string
	err  error
}

func (e *corruptError) Error() string { return fmt.Sprintf("corrupt record %s: %v", e.file, e.err) }
func (e *corruptError) Unwrap() error { return e.err }

func (s *Store) read(name string) (*Record, error) {
	path := filepath.Join(s.dir, name)
	data, err := os.ReadFile(path)
	if err != nil {
		// Not corruption: running out of fds, EINTR or EIO say nothing
		// about the record, and setting it aside would silently release
		// a pod whose capture stays in its namespace. The caller fails
		// and retries.
		return nil, fmt.Errorf("read record %s: %w", path, err)
	}
	return decodeRecord(path, name, data)
}

// decodeRecord checks a record's bytes as read, name being the file name
// it must be stored under.
func decodeRecord(path, name string, data []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, &corruptError{file: path, err: err}
	}
	if r.Version > Version {
		// Written by a newer daemon (after a rollback): valid, just not
		// ours to read. Left in place for that daemon to find again.
		return nil, &NewerError{file: path, version: r.Version}
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
	qdir := filepath.Join(s.dir, QuarantineDir)
	dst := filepath.Join(qdir, fmt.Sprintf("%s.%s", name, time.Now().UTC().Format("20060102T150405.000000000Z")))
	err := os.MkdirAll(qdir, 0o700)
	if err == nil {
		err = os.Rename(filepath.Join(s.dir, name), dst)
	}
	if err == nil {
		err = durable.SyncDir(s.dir)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return // another caller moved it first
	}
	if err != nil {
		s.log.Error("cannot quarantine corrupt record; ignoring it", "file", filepath.Join(s.dir, name), "cause", cause, "error", err)
		return
	}
	s.log.Error("corrupt record moved to quarantine; the pod is no longer enrolled and its capture may remain in its namespace: RemovePod releases it, AddPod enrols it afresh", "file", dst, "cause", cause)
}

// Put writes the record atomically and durably.
func (s *Store) Put(r *Record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode record of pod %s: %w", r.PodUID, err)
	}
	if err := durable.WriteFile(filepath.Join(s.dir, fileName(r.PodUID)), append(data, '\n')); err != nil {
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

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

// RecordPath is the file that holds (or would hold) the pod's record.
func (s *Store) RecordPath(podUID string) string {
	return filepath.Join(s.dir, fileName(podUID))
}
