package zds

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

// Modes of what listen creates. Only root (and members of the socket's
// group) may connect: whoever connects receives every pod's namespace.
const (
	dirMode    fs.FileMode = 0o750
	socketMode fs.FileMode = 0o660
)

// ErrInUse: something already answers on the socket path.
var ErrInUse = errors.New("another process serves this socket")

// listen creates a SOCK_SEQPACKET socket at path. A missing parent
// directory is created root-only; an existing one must belong to us and
// not be writable by others (who could swap the socket). A socket file
// already at path is removed only when nothing answers on it, so a second
// daemon cannot silently steal a running one's proxies; anything that is
// not a socket is left alone.
func listen(path string) (*net.UnixListener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("zds socket path %q must be absolute", path)
	}
	if err := prepareDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("set mode of %s: %w", path, err)
	}
	return ln, nil
}

func prepareDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, dirMode); err != nil {
			return fmt.Errorf("create socket directory: %w", err)
		}
		// MkdirAll's mode is filtered by the umask; set it exactly.
		if err := os.Chmod(dir, dirMode); err != nil {
			return fmt.Errorf("set mode of %s: %w", dir, err)
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket directory %s is not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("socket directory %s: no owner information", dir)
	}
	if st.Uid != uint32(os.Geteuid()) && st.Uid != 0 {
		return fmt.Errorf("socket directory %s belongs to uid %d, not root: refusing to serve namespaces there", dir, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("socket directory %s is writable by group or others (%v): refusing to serve namespaces there", dir, fi.Mode().Perm())
	}
	return nil
}

func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("zds socket: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: refusing to replace it", path)
	}
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: %w", path, ErrInUse)
	}
	if !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("probe existing socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}
