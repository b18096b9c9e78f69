package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/durable"
)

// A pod released because its runtime is deleting its namespace leaves its
// capture there for the deletion to clear. Its record is not deleted but
// moved to the teardown directory, in one rename: from then on the pod is
// not enrolled, yet the daemon still knows which namespace holds its table
// and routing, across restarts, and removes them itself if the namespace
// outlives its teardown.

// TeardownDir is the state directory's subdirectory of released pods'
// records whose namespaces were left to their deletion.
const TeardownDir = "teardown"

// stampLayout is the release time in a moved record's name: the record's
// own name, a dot, this. Quarantined files are named the same way, so a
// damaged one can move there as it is.
const stampLayout = "20060102T150405.000000000Z"

// Leftover is a released pod's record whose namespace may still hold its
// capture.
type Leftover struct {
	// Path is the file, the handle for DropLeftover.
	Path string
	// Record is the pod's record as it was when released.
	Record *Record
	// ReleasedAt is when the pod was released.
	ReleasedAt time.Time
}

// LeaveForTeardown releases the pod's record without forgetting its
// namespace: the record moves to TeardownDir, stamped with at. After a
// crash the record is in one place or the other, never lost and never in
// both. moved says whether the record left the pod's name, even when err
// says that making the move durable failed: the pod is released then,
// and its caller must act on it. A pod with no record is fine (nothing
// moves, no error).
func (s *Store) LeaveForTeardown(podUID string, at time.Time) (moved bool, err error) {
	dir := filepath.Join(s.dir, TeardownDir)
	if err := os.Mkdir(dir, 0o700); err == nil {
		// The directory's own entry first, or a power loss after the
		// rename could take the directory and the record with it.
		if err := durable.SyncDir(s.dir); err != nil {
			return false, fmt.Errorf("create %s: %w", dir, err)
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return false, fmt.Errorf("create %s: %w", dir, err)
	}
	name := fileName(podUID)
	dst := filepath.Join(dir, name+"."+at.UTC().Format(stampLayout))
	if err := os.Rename(filepath.Join(s.dir, name), dst); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("move record of pod %s to %s: %w", podUID, dir, err)
	}
	// The new name first: were only the old directory synced, a power
	// loss could leave the record in neither.
	if err := durable.SyncDir(dir); err != nil {
		return true, fmt.Errorf("move record of pod %s: %w", podUID, err)
	}
	if err := durable.SyncDir(s.dir); err != nil {
		return true, fmt.Errorf("move record of pod %s: %w", podUID, err)
	}
	return true, nil
}

// Leftovers lists the records left for teardown, oldest first. One that
// no longer decodes is moved to the quarantine, where RemovePod can still
// release its pod, and is not listed. An unreadable directory is an error,
// so no namespace is forgotten.
func (s *Store) Leftovers() ([]Leftover, error) { return s.leftovers("") }

// LeftoversOf lists the pod's records left for teardown, oldest first.
func (s *Store) LeftoversOf(podUID string) ([]Leftover, error) {
	return s.leftovers(fileName(podUID) + ".")
}

func (s *Store) leftovers(prefix string) ([]Leftover, error) {
	dir := filepath.Join(s.dir, TeardownDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var out []Leftover
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, prefix) {
			continue
		}
		recName, stamp, ok := strings.Cut(name, recordSuffix+".")
		recName += recordSuffix
		at, err := time.Parse(stampLayout, stamp)
		if !ok || err != nil || !isRecordName(recName) {
			continue // not ours: never written by LeaveForTeardown
		}
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // dropped concurrently
		}
		if err != nil {
			return nil, fmt.Errorf("read record left for teardown: %w", err)
		}
		r, err := decodeRecord(path, recName, data)
		var ne *NewerError
		switch {
		case errors.As(err, &ne):
			s.log.Warn("skipping a record this daemon cannot read", "error", err)
			continue
		case err != nil:
			s.quarantineLeftover(path, name, err)
			continue
		}
		out = append(out, Leftover{Path: path, Record: r, ReleasedAt: at})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ReleasedAt.Before(out[j].ReleasedAt) })
	return out, nil
}

func (s *Store) quarantineLeftover(path, name string, cause error) {
	qdir := filepath.Join(s.dir, QuarantineDir)
	err := os.MkdirAll(qdir, 0o700)
	if err == nil {
		err = os.Rename(path, filepath.Join(qdir, name))
	}
	if err == nil {
		err = durable.SyncDir(qdir)
	}
	if err == nil {
		err = durable.SyncDir(filepath.Dir(path))
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error("cannot quarantine a corrupt record left for teardown; ignoring it", "file", path, "cause", cause, "error", err)
		return
	}
	s.log.Error("corrupt record left for teardown moved to quarantine: RemovePod of its pod releases what it can read of it", "file", filepath.Join(qdir, name), "cause", cause)
}

// DropLeftover forgets a record left for teardown once its namespace is
// gone or clean. A missing file is fine.
func (s *Store) DropLeftover(path string) error {
	if filepath.Dir(path) != filepath.Join(s.dir, TeardownDir) {
		return fmt.Errorf("%s is not a record left for teardown", path)
	}
	if err := durable.Remove(path); err != nil {
		return fmt.Errorf("drop record left for teardown: %w", err)
	}
	return nil
}
