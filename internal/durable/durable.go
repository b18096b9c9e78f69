// Package durable writes and removes small files so that a crash at any
// instant leaves either the old content or the new, and a call that
// returned nil survives a power loss: write a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory.
package durable

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
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
	if err == nil {
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
	return SyncDir(dir)
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
