package plugin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
)

// The tests of the daemon-down path run the real nftredir-cni-helper,
// built once per test binary.
var (
	helperOnce sync.Once
	helperDir  string
	helperErr  error
)

func helperBinary(t *testing.T) string {
	t.Helper()
	helperOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			helperErr = fmt.Errorf("no go command on PATH: %w", err)
			return
		}
		if helperDir, helperErr = os.MkdirTemp("", "nftredir-cni-helper-"); helperErr != nil {
			return
		}
		out, err := exec.Command(goBin, "build", "-o", filepath.Join(helperDir, helper.Name), "github.com/nftredir/nftredir/cmd/nftredir-cni/"+helper.Name).CombinedOutput()
		if err != nil {
			helperErr = &buildError{err, out}
		}
	})
	if helperErr != nil {
		t.Fatalf("build %s: %v", helper.Name, helperErr)
	}
	return filepath.Join(helperDir, helper.Name)
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

func removeHelperBinary() {
	if helperDir != "" {
		os.RemoveAll(helperDir)
	}
}
