package deploy

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

const unitPath = "systemd/nftredird.service"

// buildDir holds the binaries the tests build, once per run; TestMain
// removes it.
var (
	buildDir  string
	buildMu   sync.Mutex
	buildErrs = map[string]error{}
)

func TestMain(m *testing.M) {
	var err error
	if buildDir, err = os.MkdirTemp("", "nftredir-deploy-test-"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.Exit(code)
}

// build builds the command cmd/<pkg> once per test run, named after its
// last element.
func build(t *testing.T, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	bin := filepath.Join(buildDir, filepath.Base(pkg))
	err, done := buildErrs[pkg]
	if !done {
		var out []byte
		out, err = exec.Command("go", "build", "-o", bin, "github.com/nftredir/nftredir/cmd/"+pkg).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
		buildErrs[pkg] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func buildDaemon(t *testing.T) string { return build(t, "nftredird") }

// buildCNI builds nftredir-cni and, beside it, the helper its install
// and uninstall hand over to.
func buildCNI(t *testing.T) string {
	build(t, "nftredir-cni/nftredir-cni-helper")
	return build(t, "nftredir-cni")
}

// unitValues returns every value of key in the unit's [Service] section.
func unitValues(t *testing.T, key string) []string {
	t.Helper()
	f, err := os.Open(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vals []string
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && section == "[Service]" && k == key {
			vals = append(vals, v)
		}
	}
	return vals
}

// TestSystemdUnitsVerify runs systemd-analyze verify on each unit, with
// ExecStart pointed at a freshly built binary. verify exits 0 on most
// mistakes it reports ("Failed to parse ..., ignoring"), so any output is
// a failure.
func TestSystemdUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd; hack/deps.sh installs it)")
	}
	for _, u := range []struct{ unit, exec, bin string }{
		{unitPath, "/usr/local/bin/nftredird", buildDaemon(t)},
		{"systemd/nftredir-cni-install.service", "/usr/local/bin/nftredir-cni install", buildCNI(t) + " install"},
	} {
		raw, err := os.ReadFile(u.unit)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), "\nExecStart="+u.exec+"\n") {
			t.Fatalf("%s: no ExecStart=%s", u.unit, u.exec)
		}
		unit := strings.Replace(string(raw), "ExecStart="+u.exec, "ExecStart="+u.bin, 1)
		p := filepath.Join(t.TempDir(), filepath.Base(u.unit))
		if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("systemd-analyze", "verify", p).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u.unit, err, out)
		}
	}
	for key, want := range map[string]string{"Type": "notify", "RuntimeDirectoryPreserve": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict"} {
		if got := unitValues(t, key); len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %s", key, got, want)
		}
	}
}

// setprivCaps turns the unit's CapabilityBoundingSet into setpriv's form.
func setprivCaps(caps []string) string {
	s := "-all"
	for _, c := range caps {
		s += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return s
}

// TestSystemdUnitCapabilitiesSuffice runs the daemon with exactly the
// unit's capability bounding set and no_new_privs, as systemd would, in a
// network namespace of its own standing for the node, and enrols a pod by
// each kind of path runtimes pass: a /run/netns bind mount (containerd,
// podman) and /proc/<pid>/ns/net of a process holding every capability.
// Without CAP_SYS_PTRACE the second is refused, which shows the test can
// tell.
func TestSystemdUnitCapabilitiesSuffice(t *testing.T) {
	nstest.RequirePrivileged(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	vals := unitValues(t, "CapabilityBoundingSet")
	if len(vals) != 1 {
		t.Fatalf("CapabilityBoundingSet %q", vals)
	}
	caps := strings.Fields(vals[0])
	bin := buildDaemon(t)
	named := nstest.NewNetns(t)
	// A root process with all capabilities in a namespace of its own.
	holder := exec.Command("unshare", "--net", "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	procPath := "/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/net"
	waitNetnsDiffers(t, procPath)

	run := func(caps []string) (namedErr, procErr error) {
		dir := t.TempDir()
		socket := filepath.Join(dir, "run", "nftredir.sock")
		cmd := exec.Command("setpriv", "--bounding-set="+setprivCaps(caps), "--inh-caps=-all", "--no-new-privs", "--",
			bin, "--socket", socket, "--state-dir", filepath.Join(dir, "pods"), "--zds-socket=", "--socket-group", "1234", "--log-format", "text")
		logf, err := os.Create(filepath.Join(dir, "log"))
		if err != nil {
			t.Fatal(err)
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for {
			h, err := c.Health(ctx)
			if err == nil && h.Serving() {
				break
			}
			if ctx.Err() != nil {
				log, _ := os.ReadFile(logf.Name())
				t.Fatalf("daemon never served: %v\n%s", err, log)
			}
			time.Sleep(20 * time.Millisecond)
		}
		_, namedErr = c.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: "named", NetnsPath: named.Path})
		_, procErr = c.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: "proc", NetnsPath: procPath})
		c.RemovePod(ctx, "named")
		c.RemovePod(ctx, "proc")
		return namedErr, procErr
	}
	if n, p := run(caps); n != nil || p != nil {
		t.Errorf("with the unit's capabilities %v: /run/netns path: %v; /proc path: %v", caps, n, p)
	}
	var noPtrace []string
	for _, c := range caps {
		if c != "CAP_SYS_PTRACE" {
			noPtrace = append(noPtrace, c)
		}
	}
	if _, p := run(noPtrace); p == nil {
		t.Error("without CAP_SYS_PTRACE the /proc path was enrolled too; then the unit needs less")
	}
}

// waitNetnsDiffers waits until path names a namespace other than the
// test's: unshare has unshared and exec'd its command.
func waitNetnsDiffers(t *testing.T, path string) {
	t.Helper()
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if ns, err := os.Readlink(path); err == nil && ns != self {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never left the test's namespace", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestInstallStepNeedsNoCapability runs the install step as the
// DaemonSet's install-cni container and nftredir-cni-install.service do:
// root with no capability and no_new_privs. Root still owns the CNI
// directories, so it can write them.
func TestInstallStepNeedsNoCapability(t *testing.T) {
	nstest.RequirePrivileged(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	bin := buildCNI(t)
	root := t.TempDir()
	confDir, binDir := filepath.Join(root, "net.d"), filepath.Join(root, "bin")
	for _, d := range []string{confDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(confDir, "87-podman-bridge.conflist")
	// 0600, as some primary CNIs write their file.
	if err := os.WriteFile(conf, []byte(`{"cniVersion":"0.4.0","name":"podman","plugins":[{"type":"bridge","bridge":"cni-podman0","ipam":{"type":"host-local","subnet":"10.88.0.0/16"}},{"type":"portmap","capabilities":{"portMappings":true}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"install", "uninstall"} {
		args := []string{"--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--", bin, sub, "--cni-bin-dir", binDir, "--cni-conf-dir", confDir}
		if sub == "install" {
			args = append(args, "--once")
		}
		out, err := exec.Command("setpriv", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s without capabilities: %v\n%s", sub, err, out)
		}
		raw, _ := os.ReadFile(conf)
		_, binErr := os.Stat(filepath.Join(binDir, "nftredir-cni"))
		if chained := strings.Contains(string(raw), `"nftredir-cni"`); chained != (sub == "install") || (binErr == nil) != (sub == "install") {
			t.Errorf("after %s: chained %v, binary %v\n%s", sub, chained, binErr, raw)
		}
		if fi, _ := os.Stat(conf); fi.Mode().Perm() != 0o600 {
			t.Errorf("after %s: mode %#o, want the file's own 0600", sub, fi.Mode().Perm())
		}
	}
}
