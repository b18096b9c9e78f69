package sockfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

func owner(t *testing.T, p string) (os.FileMode, uint32) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid
}

// TestCreatedDirBelongsToTheSocketGroup: the directory the daemon makes
// must let the socket's group through, or --socket-group is useless.
func TestCreatedDirBelongsToTheSocketGroup(t *testing.T) {
	nstest.RequirePrivileged(t) // chown to another group
	sock := filepath.Join(t.TempDir(), "a", "run", "s.sock")
	lis, err := Listen(sock, "unix", 4321)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	for p, want := range map[string]os.FileMode{filepath.Dir(sock): DirMode, sock: SocketMode} {
		if mode, gid := owner(t, p); mode != want || gid != 4321 {
			t.Errorf("%s: mode %#o group %d; want %#o group 4321", p, mode, gid, want)
		}
	}
}

func TestExistingDirMustLetTheGroupIn(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o750)
	err := PrepareDir(dir, 4321)
	if err == nil || !strings.Contains(err.Error(), "keeps out members of the socket group 4321") {
		t.Errorf("root:root 0750 dir for group 4321: %v", err)
	}
	if mode, gid := owner(t, dir); mode != 0o750 || gid != 0 {
		t.Errorf("the existing dir was changed to %#o group %d", mode, gid)
	}
	// Group 0 (the default) and a dir others may search are fine.
	if err := PrepareDir(dir, 0); err != nil {
		t.Errorf("gid 0: %v", err)
	}
	os.Chown(dir, 0, 4321)
	if err := PrepareDir(dir, 4321); err != nil {
		t.Errorf("dir of the socket group: %v", err)
	}
	os.Chown(dir, 0, 0)
	os.Chmod(dir, 0o755)
	if err := PrepareDir(dir, 4321); err != nil {
		t.Errorf("0755 dir: %v", err)
	}
}
