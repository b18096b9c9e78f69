package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// The socket is the daemon's only access control besides SO_PEERCRED:
// a root-owned directory that nobody else may write, and a 0660 socket
// owned by root and the configured group (see CVE-2022-29178 for what an
// inherited group did to another node agent).

// prepareSocketDir creates dir 0750 owned by us (root), or checks that an
// existing one is ours and not world-writable: anyone who could write
// there could replace the socket with their own.
func prepareSocketDir(dir string, log hclog.Logger) error {
	err := os.Mkdir(dir, 0o750)
	switch {
	case err == nil:
		// Mkdir's mode passes through the umask; set it exactly.
		if err := os.Chmod(dir, 0o750); err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return fmt.Errorf("create parent of socket directory %s: %w", dir, err)
		}
		return prepareSocketDir(dir, log)
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
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("socket directory %s is owned by uid %d, not by the daemon's uid %d; fix its owner or choose another --socket", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("socket directory %s is world-writable (mode %#o); make it 0750 or choose another --socket", dir, fi.Mode().Perm())
	}
	if fi.Mode().Perm()&0o005 != 0 {
		log.Warn("socket directory is accessible to everyone; 0750 is recommended", "dir", dir, "mode", fmt.Sprintf("%#o", fi.Mode().Perm()))
	}
	return nil
}

// clearStaleSocket removes a socket file left by a daemon that is gone,
// and refuses to touch one that still answers or is not a socket.
func clearStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; remove it or choose another --socket", path)
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("another nftredird is serving on %s; stop it first", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot tell whether %s is in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// listenSocket prepares the directory, clears a stale socket, and listens
// with mode 0660 and group gid. The umask covers the moment between bind
// and chmod; it is process-wide, which is safe only because nothing else
// creates files while the daemon starts.
func listenSocket(path string, gid int, log hclog.Logger) (*net.UnixListener, error) {
	if err := prepareSocketDir(filepath.Dir(path), log); err != nil {
		return nil, err
	}
	if err := clearStaleSocket(path); err != nil {
		return nil, err
	}
	old := unix.Umask(0o117)
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chown(path, os.Geteuid(), gid); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chown socket %s to group %d: %w", path, gid, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return lis, nil
}
