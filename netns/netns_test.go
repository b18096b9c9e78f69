package netns_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"golang.org/x/sys/unix"
)

func TestOpenRefuses(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	mustSymlink(t, "/proc/1/ns/net", filepath.Join(dir, "node-link"))
	mustSymlink(t, "/proc/self/ns/net", filepath.Join(dir, "self-link"))
	mustSymlink(t, filepath.Join(dir, "missing"), filepath.Join(dir, "dangling-link"))
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, []byte("not a namespace"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	// Some sandboxes forbid even root to look at PID 1's namespaces. Open
	// then fails before any check can run; that is still a refusal, but
	// one that carries ErrNoAccess instead of ErrHostNetns.
	nodeErr := netns.ErrHostNetns
	if _, err := os.Stat("/proc/1/ns/net"); errors.Is(err, os.ErrPermission) {
		t.Logf("/proc/1/ns/net is unreadable here (%v); expecting ErrNoAccess for it", err)
		nodeErr = netns.ErrNoAccess
	}
	for _, tc := range []struct {
		name, path string
		want       error
	}{
		{"node namespace", "/proc/1/ns/net", nodeErr},
		{"own namespace", "/proc/self/ns/net", netns.ErrHostNetns},
		{"own namespace by pid", fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), netns.ErrHostNetns},
		{"symlink to node namespace", filepath.Join(dir, "node-link"), nodeErr},
		{"symlink to own namespace", filepath.Join(dir, "self-link"), netns.ErrHostNetns},
		{"regular file", regular, netns.ErrNotNetns},
		{"directory", dir, netns.ErrNotNetns},
		// Opening must neither block on a FIFO nor take a terminal.
		{"fifo", fifo, netns.ErrNotNetns},
		{"character device", "/dev/null", netns.ErrNotNetns},
		{"unix socket", sock, netns.ErrNotNetns},
		{"procfs file", "/proc/self/status", netns.ErrNotNetns},
		{"mount namespace", "/proc/self/ns/mnt", netns.ErrNotNetns},
		{"missing path", filepath.Join(dir, "missing"), netns.ErrNotExist},
		{"dangling symlink", filepath.Join(dir, "dangling-link"), netns.ErrNotExist},
		{"path through a file", filepath.Join(regular, "net"), netns.ErrNotExist},
		{"relative path", "proc/self/ns/net", netns.ErrNotAbsolute},
		{"empty path", "", netns.ErrNotAbsolute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := g.Open(tc.path)
			if err == nil {
				h.Close()
				t.Fatalf("Open(%q) succeeded, want %v", tc.path, tc.want)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open(%q) = %v, want errors.Is %v", tc.path, err, tc.want)
			}
		})
	}
}

func TestOpenAccepts(t *testing.T) {
	ns := nstest.NewNetns(t)
	pid := ns.StartProcess(t, "sleep", "60")
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(ns.Path, &st); err != nil {
		t.Fatal(err)
	}
	want := netns.ID{Dev: st.Dev, Ino: st.Ino}
	dir := t.TempDir()
	mustSymlink(t, ns.Path, filepath.Join(dir, "pod-link"))
	for _, path := range []string{
		ns.Path,
		fmt.Sprintf("/proc/%d/ns/net", pid),
		filepath.Join(dir, "pod-link"),
	} {
		t.Run(path, func(t *testing.T) {
			h, err := g.Open(path)
			if err != nil {
				t.Fatalf("Open(%q): %v", path, err)
			}
			defer h.Close()
			if h.Path() != path {
				t.Errorf("Path() = %q, want %q", h.Path(), path)
			}
			if !h.ID().SameFile(want) || h.ID().Cookie == 0 {
				t.Errorf("ID() = %s, want %s (the namespace's dev:ino) and a cookie", h.ID(), want)
			}
			if _, err := unix.FcntlInt(uintptr(h.Fd()), unix.F_GETFD, 0); err != nil {
				t.Errorf("Fd() %d is not open: %v", h.Fd(), err)
			}
			id, err := netns.ParseID(h.ID().String())
			if err != nil || id != h.ID() {
				t.Errorf("ParseID(%q) = %v, %v; want %v", h.ID().String(), id, err, h.ID())
			}
			if err := h.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := h.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// TestGuardExtraProtected: a namespace named at construction (a configured
// node namespace, say) is refused like the process's own.
func TestGuardExtraProtected(t *testing.T) {
	protected := nstest.NewNetns(t)
	other := nstest.NewNetns(t)
	g, err := netns.NewGuard(protected.Path)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := g.Open(protected.Path); !errors.Is(err, netns.ErrHostNetns) {
		h.Close()
		t.Errorf("Open(protected %s) = %v, want %v", protected.Path, err, netns.ErrHostNetns)
	}
	h, err := g.Open(other.Path)
	if err != nil {
		t.Fatalf("Open(unprotected %s): %v", other.Path, err)
	}
	h.Close()
	if _, err := netns.NewGuard("/proc/self/ns/mnt-missing"); err == nil {
		t.Errorf("NewGuard with a missing protected path succeeded")
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestIDSurvivesInodeReuse recreates a namespace at the same path after the
// first one is gone: the kernel hands out the freed inode number again, but
// the ID must still differ, or a record of the dead pod would claim the new
// namespace.
func TestIDSurvivesInodeReuse(t *testing.T) {
	nstest.RequirePrivileged(t)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("nftr-reuse-%d", os.Getpid())
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	seen := map[netns.ID]bool{}
	inodes := map[uint64]bool{}
	reused := 0
	for i := 0; i < 8; i++ {
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v: %s", err, out)
		}
		h, err := g.Open("/run/netns/" + name)
		if err != nil {
			t.Fatal(err)
		}
		id := h.ID()
		h.Close()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns del: %v: %s", err, out)
		}
		if id.Cookie == 0 {
			t.Fatalf("no namespace cookie on this kernel (%s)", id)
		}
		if seen[id] {
			t.Fatalf("namespace ID %s seen for two different namespaces", id)
		}
		seen[id] = true
		if inodes[id.Ino] {
			reused++
		}
		inodes[id.Ino] = true
		// Namespaces are freed asynchronously; give the kernel a moment so
		// the next one can get the inode back, which is the case at stake.
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("inode numbers reused %d times in 8 namespaces; IDs all distinct", reused)
	parsed, err := netns.ParseID((netns.ID{Dev: 4, Ino: 4026532177, Cookie: 99}).String())
	if err != nil || parsed != (netns.ID{Dev: 4, Ino: 4026532177, Cookie: 99}) {
		t.Fatalf("ParseID round trip = %v, %v", parsed, err)
	}
}
