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
	RequirePrivileged(t)
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no /dev/fuse: cannot make a hung mount")
	}
	if err != nil {
		t.Fatalf("open /dev/fuse: %v", err)
	}
	dir, err = os.MkdirTemp("", "nftredir-hung-")
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount("nftredir-hung", dir, "fuse.nftredir-hung", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		os.Remove(dir)
		t.Fatalf("mount a FUSE filesystem on %s: %v", dir, err)
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
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir, abort
}
