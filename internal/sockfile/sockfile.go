// Package sockfile creates the daemon's Unix sockets safely. A socket is
// the access control for everything behind it (the gRPC API; pods'
// namespace fds over ZDS), so its directory must be one nobody else can
// write (or they could swap the socket), the socket must not be readable
// by the world, and a socket file found at the path is replaced only when
// nothing answers on it, so a second daemon cannot silently take over a
// running one's callers.
package sockfile

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Modes of what Listen creates: only the owner (root) and the socket's
// group may connect.
const (
	DirMode    fs.FileMode = 0o750
	SocketMode fs.FileMode = 0o660
)

var (
	// ErrInUse: something answers on the socket path.
	ErrInUse = errors.New("another process serves this socket")
	// ErrNotSocket: the path exists and is not a socket; it is left alone.
	ErrNotSocket = errors.New("exists and is not a socket")
)

// PrepareDir creates dir with DirMode, owned by this process's user and
// group gid, so that the socket's group can reach the socket (parents are
// made 0755). An existing dir is checked instead: a real directory (not a
// symlink), belonging to this process's user or root, writable by nobody
// else, and, for a gid other than 0, searchable by group gid; it is never
// changed, since it may hold more than the daemon's sockets.
func PrepareDir(dir string, gid int) error {
	err := os.Mkdir(dir, DirMode)
	switch {
	case err == nil:
		// Without the group, members of the socket's group could not get
		// to the socket in the directory the daemon creates after every
		// boot (/run is tmpfs).
		if err := os.Chown(dir, os.Geteuid(), gid); err != nil {
			return fmt.Errorf("chown socket directory %s to group %d: %w", dir, gid, err)
		}
		// Mkdir's mode passes through the umask; set it exactly.
		if err := os.Chmod(dir, DirMode); err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return fmt.Errorf("create parent of socket directory %s: %w", dir, err)
		}
		return PrepareDir(dir, gid)
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("create socket directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket directory %s exists and is not a directory (symlinks are refused)", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("socket directory %s: cannot read its owner", dir)
	}
	if int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return fmt.Errorf("socket directory %s is owned by uid %d, not by root or this process (uid %d)", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("socket directory %s is writable by group or others (mode %#o); make it %#o", dir, fi.Mode().Perm(), DirMode)
	}
	perm := fi.Mode().Perm()
	if gid != 0 && perm&0o001 == 0 && (int(st.Gid) != gid || perm&0o010 == 0) {
		return fmt.Errorf("socket directory %s (group %d, mode %#o) keeps out members of the socket group %d; chgrp it to %d with mode %#o, or remove it and let the daemon create it", dir, st.Gid, perm, gid, gid, DirMode)
	}
	return nil
}

// ClearStale removes a socket file at path that nothing answers on
// (network is "unix" or "unixpacket"). A live socket gives ErrInUse, a
// file of another kind ErrNotSocket; both are left in place.
func ClearStale(path, network string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s %w", path, ErrNotSocket)
	}
	c, err := net.DialTimeout(network, path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: %w", path, ErrInUse)
	}
	if !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("cannot tell whether %s is in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// Listen prepares the directory, clears a stale socket and listens on
// path with SocketMode, owned by this process's user and group gid.
func Listen(path, network string, gid int) (*net.UnixListener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket path %q must be absolute", path)
	}
	if err := PrepareDir(filepath.Dir(path), gid); err != nil {
		return nil, err
	}
	if err := ClearStale(path, network); err != nil {
		return nil, err
	}
	// The umask covers the moment between bind and chmod. It is
	// process-wide, which is safe because the daemon creates its sockets
	// while starting, before it creates any other file.
	old := unix.Umask(0o117)
	lis, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chown(path, os.Geteuid(), gid); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chown socket %s to group %d: %w", path, gid, err)
	}
	if err := os.Chmod(path, SocketMode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return lis, nil
}
