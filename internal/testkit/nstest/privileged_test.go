package nstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// childEnv marks the re-executed test binary that plays the unprivileged
// user.
const childEnv = "NFTREDIR_NSTEST_CHILD"

// TestRequirePrivilegedAsNonRoot runs a privileged test as uid 65534: a
// plain run skips it with the reason, a CI run fails it.
func TestRequirePrivilegedAsNonRoot(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		RequirePrivileged(t)
		t.Log("ran the privileged part")
		return
	}
	RequirePrivileged(t) // only root can drop to another uid
	// The test binary sits in a directory only root may enter: copy it
	// where uid 65534 can run it.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nstest-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nstest.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{ci: "", want: "--- SKIP"},
		{ci: "true", wantFail: true, want: "--- FAIL"},
	} {
		cmd := exec.Command(bin, "-test.run=^TestRequirePrivilegedAsNonRoot$", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"=1", "CI="+tc.ci, SkipEnv+"=")
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.wantFail {
			t.Errorf("CI=%q: exit error %v, want failure %v\n%s", tc.ci, err, tc.wantFail, out)
		}
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "needs root") || strings.Contains(string(out), "ran the privileged part") {
			t.Errorf("CI=%q: want %q and the reason, and the privileged part not run:\n%s", tc.ci, tc.want, out)
		}
	}
}
