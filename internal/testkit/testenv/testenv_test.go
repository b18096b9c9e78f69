package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The verdict is read from a child test process, since a skip or a
// failure ends the test that meets it.
func TestMissingSkipsOrFailsUnderCI(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		Missing(t, "no %s here", "widget")
		return
	}
	for _, tc := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{ci: "", wantFail: false, want: "--- SKIP"},
		{ci: "false", wantFail: false, want: "--- SKIP"},
		{ci: "true", wantFail: true, want: "--- FAIL"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingSkipsOrFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.wantFail {
			t.Errorf("CI=%q: exit error %v, want failure %v\n%s", tc.ci, err, tc.wantFail, out)
		}
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "no widget here") {
			t.Errorf("CI=%q: output lacks %q and the message:\n%s", tc.ci, tc.want, out)
		}
	}
}
