package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/durable"
)

// agentSubdir holds the Kubernetes agent's kinds (sightings, and under
// annotated/ the marks) in the state directory, beside the pod records,
// teardown/ and quarantine/: one directory holds everything the daemon
// keeps, so one copy, one cleanup and one filesystem cover it all. It
// keeps the name of the directory the agent had of its own
// (/run/nftredir/seen), so that its layout inside is unchanged.
const agentSubdir = "seen"

// AgentDir is the directory of the Kubernetes agent's records in the
// state directory stateDir.
func AgentDir(stateDir string) string { return filepath.Join(stateDir, agentSubdir) }

// AdoptAgentDir moves what the Kubernetes agent kept in a directory of its
// own, old (--kubernetes-state-dir, before its records moved under the
// state directory), into AgentDir(stateDir), keeping each file's path
// inside, and removes old once it is empty. The files are moved as they
// are: the agent's open brings their format up to date, as for any
// record. A missing old is nothing to do.
//
// Each file is moved in one rename (durable.Move), or copied durably and
// then removed when the two directories are on different filesystems, so
// a crash leaves it in one place, or for a copy in both; a file that is
// already in the new place was written there by a daemon that adopted
// old before, and is the one kept. A directory that does not empty (a
// file of another kind than a regular one, which nothing here writes) is
// left with a warning. It returns how many files it moved.
func AdoptAgentDir(old, stateDir string, log hclog.Logger) (int, error) {
	if old == "" {
		return 0, nil
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if err := CheckAdopt(old, stateDir); err != nil {
		return 0, err
	}
	old, stateDir = filepath.Clean(old), filepath.Clean(stateDir)
	dst := AgentDir(stateDir)
	if old == dst {
		return 0, nil
	}
	fi, err := os.Lstat(old)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("adopt %s: %w", old, err)
	}
	// Names are compared as the kernel resolves them, and the directories
	// by identity: a link to the agent's place (kept for a rollback), a
	// parent reached through a link (/var/run is /run) or a bind mount of
	// it is the agent's place itself, whose every file would otherwise
	// count as already moved and be deleted.
	if same, err := sameFile(old, dst); err != nil || same {
		return 0, err
	}
	realOld, err := filepath.EvalSymlinks(old)
	if err != nil {
		return 0, fmt.Errorf("adopt %s: %w", old, err)
	}
	realState, err := resolveExisting(stateDir)
	if err != nil {
		return 0, fmt.Errorf("adopt %s: %w", old, err)
	}
	if err := CheckAdopt(realOld, realState); err != nil {
		return 0, err
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		// A DaemonSet may have pointed the old flag at a link: what it
		// leads to is what the old daemon wrote to, and the link goes
		// with it.
		target, err := filepath.EvalSymlinks(old)
		if err != nil {
			return 0, fmt.Errorf("adopt %s: %w", old, err)
		}
		if err := CheckAdopt(target, stateDir); err != nil {
			return 0, err
		}
		link, old = old, target
		if fi, err = os.Stat(old); err != nil {
			return 0, fmt.Errorf("adopt %s: %w", link, err)
		}
	}
	if !fi.IsDir() {
		return 0, fmt.Errorf("adopt %s: not a directory", old)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return 0, fmt.Errorf("adopt %s: %w", old, err)
	}
	moved := 0
	var dirs []string
	err = filepath.WalkDir(old, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(old, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if same, err := sameFile(path, to); err != nil || same {
			// Never a file deleted as its own copy: two names of one
			// directory that the checks above missed.
			if err == nil {
				err = fmt.Errorf("%s and %s are the same file", path, to)
			}
			return err
		}
		switch {
		case d.IsDir():
			dirs = append(dirs, path)
			return durable.Mkdir(to)
		case !d.Type().IsRegular():
			log.Warn("leaving a file that is not a record in the Kubernetes agent's old directory", "file", path)
			return nil
		case strings.HasPrefix(d.Name(), durable.TempPrefix):
			// A write that never completed, never acknowledged.
			return os.Remove(path)
		}
		if _, err := os.Lstat(to); err == nil {
			return durable.Remove(path)
		}
		if err := moveFile(path, to); err != nil {
			return err
		}
		moved++
		return nil
	})
	if err != nil {
		return moved, fmt.Errorf("adopt %s into %s: %w", old, dst, err)
	}
	// Deepest first: a directory empties once its children are gone.
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Remove(d); err != nil {
			log.Warn("the Kubernetes agent's old directory is not empty; leaving it", "dir", d, "error", err)
			return moved, nil
		}
	}
	if err := durable.SyncDir(filepath.Dir(old)); err != nil {
		return moved, err
	}
	if link != "" {
		if err := durable.Remove(link); err != nil {
			return moved, err
		}
	}
	log.Info("Kubernetes agent's records moved into the state directory", "from", old, "to", dst, "files", moved)
	return moved, nil
}

// CheckAdopt says whether AdoptAgentDir may move old into stateDir: both
// absolute, and neither holding the other, unless old is the agent's
// place in stateDir already (nothing to move).
func CheckAdopt(old, stateDir string) error {
	if !filepath.IsAbs(old) || !filepath.IsAbs(stateDir) {
		return fmt.Errorf("the Kubernetes agent's old directory %q and the state directory %q must be absolute", old, stateDir)
	}
	old, stateDir = filepath.Clean(old), filepath.Clean(stateDir)
	if old != AgentDir(stateDir) && (within(stateDir, old) || within(old, stateDir)) {
		return fmt.Errorf("the Kubernetes agent's old directory %s and the state directory %s overlap", old, stateDir)
	}
	return nil
}

// sameFile reports whether a and b both exist and are the same file (one
// device and inode), following links.
func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}

// resolveExisting resolves the links of path's longest existing prefix and
// appends the rest: the name path will have once created.
func resolveExisting(path string) (string, error) {
	rest := ""
	for p := path; ; p = filepath.Dir(p) {
		real, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || p == filepath.Dir(p) {
			return "", err
		}
		rest = filepath.Join(filepath.Base(p), rest)
	}
}

// moveFile moves src to dst durably, copying across filesystems.
func moveFile(src, dst string) error {
	err := durable.Move(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := durable.WriteFile(dst, data); err != nil {
		return err
	}
	return durable.Remove(src)
}

// within reports whether path is dir or under it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
