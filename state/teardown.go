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
	name := fileName(podUID)
	err = durable.Move(filepath.Join(s.dir, name), filepath.Join(s.dir, TeardownDir, movedName(name, at)))
	var pe *os.LinkError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pe) && errors.Is(err, fs.ErrNotExist):
		return false, nil // no record: nothing moves
	case errors.As(err, &pe):
		return false, fmt.Errorf("move record of pod %s to %s: %w", podUID, TeardownDir, err)
	default:
		// The rename happened or never started; only a sync failed, or
		// the directory could not be made.
		_, statErr := os.Stat(filepath.Join(s.dir, name))
		return errors.Is(statErr, fs.ErrNotExist), fmt.Errorf("move record of pod %s to %s: %w", podUID, TeardownDir, err)
	}
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
	files, err := durable.ReadDir(dir, func(name string) bool { return strings.HasPrefix(name, prefix) })
	if err != nil {
		return nil, fmt.Errorf("read records left for teardown: %w", err)
	}
	var out []Leftover
	for _, f := range files {
		recName, stamp, ok := parseMoved(f.Name)
		at, err := time.Parse(stampLayout, stamp)
		if !ok || err != nil {
			continue // not ours: never written by LeaveForTeardown
		}
		path := filepath.Join(dir, f.Name)
		r, err := decodeRecord(path, recName, f.Data)
		var ne *NewerError
		switch {
		case errors.As(err, &ne):
			s.log.Warn("skipping a record this daemon cannot read", "error", err)
			continue
		case err != nil:
			dst, qerr := setAside(s.dir, path, recName, time.Now())
			if qerr != nil {
				s.log.Error("cannot quarantine a corrupt record left for teardown; ignoring it", "file", path, "cause", err, "error", qerr)
			} else if dst != "" {
				s.log.Error("corrupt record left for teardown moved to quarantine: RemovePod of its pod releases what it can read of it", "file", dst, "cause", err)
			}
			continue
		}
		out = append(out, Leftover{Path: path, Record: r, ReleasedAt: at})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ReleasedAt.Before(out[j].ReleasedAt) })
	return out, nil
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
