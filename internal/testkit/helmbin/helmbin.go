// Package helmbin finds the pinned helm that hack/helm.sh builds and
// caches, for the tests that render or install charts/nftredir.
package helmbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Version is hack/helm.sh's HELM_VERSION: the cache dir is named by it.
const Version = "v3.22.0"

// Path returns $NFTREDIR_HELM, else the cached
// ${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/helm-<Version>/bin/helm,
// after checking that it runs and reports Version.
func Path() (string, error) {
	p := os.Getenv("NFTREDIR_HELM")
	if p == "" {
		base := os.Getenv("NFTREDIR_TOOLS_CACHE")
		if base == "" {
			base = "/var/cache/nftredir"
		}
		p = filepath.Join(base, "helm-"+Version, "bin", "helm")
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("helm %s not found (%v); build and cache it once per machine with hack/helm.sh (make deps does)", Version, err)
	}
	out, err := exec.Command(p, "version", "--template", "{{.Version}}").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s version: %v\n%s", p, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != Version {
		return "", fmt.Errorf("%s is helm %s; the tests pin %s (hack/helm.sh)", p, got, Version)
	}
	return p, nil
}
