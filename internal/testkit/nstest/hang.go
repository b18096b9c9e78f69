package nstest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// HungMount mounts a FUSE filesystem whose server never answers, as a
// hung FUSE or NFS mount behaves: every lookup, stat or open below the
// returned directory blocks in the kernel until abort is called (which
// fails the blocked calls with ENOTCONN). No FUSE library is involved:
// the test process opens /dev/fuse, mounts, and never reads the device,
// so not even the INIT handshake completes. Skips without /dev/fuse.
// The mount is aborted and detached when the test ends.
func HungMount(t testing.TB) (dir string, abort func()) {
	t.Helper()
	dir, err := os.MkdirTemp("", "nftredir-hung-")
	if err != nil {
		t.Fatal(err)
	}
	abort = mountHung(t, dir, "40000")
	t.Cleanup(func() { os.Remove(dir) })
	return dir, abort
}

// HungFile mounts such a FUSE filesystem over the existing regular file
// path, its root a regular file: a directory listing still shows path as
// the regular file it was, but opening it blocks, as a namespace pin on
// a hung mount would.
func HungFile(t testing.TB, path string) (abort func()) {
	t.Helper()
	return mountHung(t, path, "100000")
}

func mountHung(t testing.TB, target, rootmode string) (abort func()) {
	t.Helper()
	RequirePrivileged(t)
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no /dev/fuse: cannot make a hung mount")
	}
	if err != nil {
		t.Fatalf("open /dev/fuse: %v", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=%s,user_id=0,group_id=0", fd, rootmode)
	if err := unix.Mount("nftredir-hung", target, "fuse.nftredir-hung", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Fatalf("mount a FUSE filesystem on %s: %v", target, err)
	}
	closed := false
	abort = func() {
		if !closed {
			closed = true
			unix.Close(fd)
		}
	}
	t.Cleanup(func() {
		abort()
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
	return abort
}
