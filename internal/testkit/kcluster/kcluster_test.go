package kcluster

import (
	"os"
	"regexp"
	"testing"
)

// The Go side and the script that builds the binaries must name the same
// release, or Start looks in a cache directory nothing fills.
func TestVersionMatchesToolsScript(t *testing.T) {
	b, err := os.ReadFile("../../../hack/k8s-tools.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^K8S_VERSION=(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no K8S_VERSION= line in hack/k8s-tools.sh")
	}
	if string(m[1]) != KubeVersion {
		t.Errorf("hack/k8s-tools.sh builds %s, kcluster expects %s", m[1], KubeVersion)
	}
}

func TestNetnsPath(t *testing.T) {
	for _, tc := range []struct{ info, want string }{
		{`{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1234"}]}}}`, "/var/run/netns/cni-1234"},
		{`{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/proc/1/ns/net"}]}}}`, ""},
		{`{"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}`, ""},
		{``, ""},
	} {
		if got := netnsPath(tc.info); got != tc.want {
			t.Errorf("netnsPath(%s) = %q, want %q", tc.info, got, tc.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a\040b`: "/tmp/a b",
		`/tmp/plain`:  "/tmp/plain",
		`/x\134y`:     `/x\y`,
		`/trail\04`:   `/trail\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
