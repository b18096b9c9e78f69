package istiotest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// The Go side and the script that builds istiod must name the same
// version, or Require looks in a cache directory nothing fills.
func TestVersionMatchesToolsScript(t *testing.T) {
	b, err := os.ReadFile("../../../hack/istio-tools.sh")
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

// The agent's root, as StartIstioCNI runs it, gives it what its DaemonSet
// would: the plugin, the node's CNI dirs, the service account, a /host/proc
// whose pid 1 network namespace it may stat, and the runtime's netns pins,
// including one made after it started (mount propagation). Nothing of it
// shows on the machine.
func TestIstioCNIRoot(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	cniBin, cniConf, shared := filepath.Join(dir, "cni-bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "run")
	for _, d := range []string{cniBin, cniConf, shared} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(cniConf, "10-x.conflist"), []byte("primary"), 0o644)
	plugin := filepath.Join(dir, "plugin")
	os.WriteFile(plugin, []byte("#!/bin/sh\necho the plugin\n"), 0o755)
	script, err := istioCNIRoot(root, map[string]string{"token": "tok", "namespace": "istio-system"}, []string{shared})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/var/run/netns"); err != nil {
		t.Skipf("no /var/run/netns: %v", err)
	}
	pin := "nftredir-istiocni-" + strconv.Itoa(os.Getpid())
	check := `set -e
/opt/cni/bin/istio-cni
cat /host/etc/cni/net.d/10-x.conflist; echo
cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo
echo pid $$
stat -L -c %i /host/proc/1/ns/net >/dev/null && echo host netns readable
touch ` + shared + `/from-agent
n=0; while [ ! -e /host/var/run/netns/` + pin + ` ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
stat -f -c %T /host/var/run/netns/` + pin
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, []byte("#!/bin/sh\n"+check+"\n"), 0o755)
	cmd := exec.Command("unshare", unshareArgs(script, root, cniBin, cniConf, plugin, agent, agentInRoot)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if b, err := exec.Command("ip", "netns", "add", pin).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, b)
	}
	defer exec.Command("ip", "netns", "delete", pin).Run()
	err = cmd.Wait()
	t.Logf("in the agent's root:\n%s", out.String())
	if err != nil {
		t.Fatalf("%v", err)
	}
	for _, want := range []string{"the plugin\n", "primary\n", "tok\n", "pid 1\n", "host netns readable\n", "nsfs\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the agent's view lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(shared, "from-agent")); err != nil {
		t.Errorf("a shared path is not the machine's: %v", err)
	}
	for _, p := range []string{"/host", "/opt/cni/bin/istio-cni", "/run/secrets"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists on the machine", p)
		}
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), root) {
		t.Errorf("mounts under %s on the machine after the agent's end", root)
	}
}

// TestProblemLines: the early errors and warnings of an Istio component's
// log (its second field is the level), in order, at most n.
func TestProblemLines(t *testing.T) {
	log := "2026-12-03T02:35:20.1Z\tinfo\tcni-agent\tstarting\n" +
		"2026-12-03T02:35:20.2Z\terror\tcni-agent\tfailed to create ipset\n" +
		"2026-12-03T02:35:20.3Z\twarn\tfailed to setup execution environment\n" +
		"a line the level of which is not its second field: error\n" +
		"2026-12-03T02:35:20.4Z\terror\tcni-plugin\tcmdAdd failed\n"
	if got, want := problemLines(log, 2), "2026-12-03T02:35:20.2Z\terror\tcni-agent\tfailed to create ipset\n2026-12-03T02:35:20.3Z\twarn\tfailed to setup execution environment\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := problemLines("2026-12-03T02:35:20.1Z\tinfo\tall well\n", 40); got != "" {
		t.Errorf("a log without problems gave %q", got)
	}
}
