// Package durable writes, moves, removes and lists small files so that a
// crash at any instant leaves either the old content or the new, and a
// call that returned nil survives a power loss: write a temporary file in
// the same directory, fsync it, rename it over the target, fsync the
// directory. (Replace is the one exception: atomic, not fsynced.) Whether
// the files outlive a reboot is the filesystem's: on tmpfs they do not.
package durable

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TempPrefix starts the name of every temporary file WriteFile creates, so
// a reader of the directory can skip (or sweep) what a crash left behind.
const TempPrefix = ".tmp-"

// WriteFile replaces path with data atomically and durably. The file gets
// the mode os.CreateTemp gives (0600).
func WriteFile(path string, data []byte) error {
	return WriteFrom(path, bytes.NewReader(data), 0o600)
}

// WriteFrom replaces path with what r holds, atomically and durably: a
// temporary file in the same directory, fsync, chmod to mode, rename,
// directory fsync. The temporary name starts with TempPrefix and keeps
// no extension, so nothing that loads files of the directory by their
// names (a CNI runtime) picks it up.
func WriteFrom(path string, r io.Reader, mode fs.FileMode) error {
	return write(path, r, mode, true)
}

// Replace replaces path with data atomically but does not fsync: a crash
// of the process leaves the old content or the new, a power loss may
// leave either or none. For files that describe only what a reboot
// destroys anyway, where two disk flushes per write buy nothing.
func Replace(path string, data []byte) error {
	return write(path, bytes.NewReader(data), 0o600, false)
}

func write(path string, r io.Reader, mode fs.FileMode, sync bool) error {
	dir, name := filepath.Split(path)
	f, err := os.CreateTemp(dir, TempPrefix+name+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if !sync {
		return nil
	}
	return SyncDir(dir)
}

// Move renames src to dst durably, creating dst's directory if needed:
// after a crash the file is under one name or the other, never neither
// (dst's directory is synced before src's) and never both.
func Move(src, dst string) error {
	if err := Mkdir(filepath.Dir(dst)); err != nil {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	if filepath.Dir(src) == filepath.Dir(dst) {
		return nil
	}
	return SyncDir(filepath.Dir(src))
}

// Mkdir creates dir (mode 0700) if it is missing, durably: its entry in
// its parent is synced, or a power loss after a file is moved into it
// could take the directory and the file with it.
func Mkdir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(dir))
}

// File is one file ReadDir read.
type File struct {
	Name string
	Data []byte
}

// Names lists the regular files of dir that match accepts (every one when
// match is nil), leaving out the temporary files of writes that never
// completed. A missing directory is empty; one that cannot be read is an
// error, so that a caller never takes an unreadable record for none.
func Names(dir string, match func(name string) bool) ([]string, error) {
	entries, err := list(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, TempPrefix) || (match != nil && !match(name)) {
			continue
		}
		out = append(out, name)
	}
	return out, nil
}

// ReadDir reads the files Names lists. A file removed between the listing
// and its read is left out (it was removed by a concurrent caller); any
// other failure to read is an error, as for Names.
func ReadDir(dir string, match func(name string) bool) ([]File, error) {
	names, err := Names(dir, match)
	if err != nil {
		return nil, err
	}
	out := make([]File, 0, len(names))
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, File{Name: name, Data: data})
	}
	return out, nil
}

// RemoveTemps removes the temporary files of writes that never completed
// from dir, those older than minAge: a younger one may be a write in
// progress by another process. It returns how many it removed.
func RemoveTemps(dir string, minAge time.Duration, now time.Time) (int, error) {
	entries, err := list(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		if minAge > 0 {
			fi, err := e.Info()
			if err != nil || now.Sub(fi.ModTime()) <= minAge {
				continue
			}
		}
		err := os.Remove(filepath.Join(dir, e.Name()))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("remove stale temp file: %w", err)
		}
		if err == nil {
			n++
		}
	}
	return n, nil
}

// Remove deletes path durably; a missing file is fine.
func Remove(path string) error {
	err := os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes a rename or unlink in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// list is dir's entries; a missing directory has none.
func list(dir string) ([]fs.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	return entries, nil
}
