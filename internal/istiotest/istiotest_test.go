package istiotest

import (
	"os"
	"regexp"
	"testing"
)

// The Go side and the script that builds istiod must name the same
// version, or Require looks in a cache directory nothing fills.
func TestVersionMatchesToolsScript(t *testing.T) {
	b, err := os.ReadFile("../../hack/istio-tools.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ISTIO_VERSION=(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no ISTIO_VERSION= line in hack/istio-tools.sh")
	}
	if string(m[1]) != Version {
		t.Errorf("hack/istio-tools.sh builds %s, istiotest expects %s", m[1], Version)
	}
}

func TestBinDir(t *testing.T) {
	t.Setenv(BinEnv, "")
	t.Setenv("NFTREDIR_TOOLS_CACHE", "/cache")
	if got, want := BinDir(), "/cache/istio-"+Version+"/bin"; got != want {
		t.Errorf("BinDir() = %q, want %q", got, want)
	}
	t.Setenv(BinEnv, "/elsewhere")
	if got := BinDir(); got != "/elsewhere" {
		t.Errorf("BinDir() with %s set = %q", BinEnv, got)
	}
}
