package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
	"github.com/nftredir/nftredir/internal/testkit/syncbuf"
)

func noEnv(string) (string, bool) { return "", false }

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func entryOf(t *testing.T, cfg Config) map[string]any {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal(cfg.Entry, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestParseDefaults(t *testing.T) {
	o, cfg, err := parse(CmdInstall, nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.BinDirs, []string{"/opt/cni/bin", "/usr/lib/cni"}) || cfg.ConfDir != "/etc/cni/net.d" || cfg.ConfName != "" || o.cleanupOnExit {
		t.Errorf("defaults: %+v %+v", cfg, o)
	}
	e := entryOf(t, cfg)
	want := map[string]any{"type": "nftredir-cni", "socket": "/run/nftredir/nftredir.sock", "timeout": "10s", "excludeNamespaces": []any{"kube-system"}}
	if !jsonEqual(e, want) {
		t.Errorf("entry %v, want %v", e, want)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func TestParseFlagsAndEnv(t *testing.T) {
	_, cfg, err := parse(CmdInstall, []string{"--cni-bin-dir", "/a", "--cni-bin-dir=/b,/c", "--exclude-namespaces=", "--log-file", "/var/log/x.log"},
		envMap(map[string]string{"NFTREDIR_CNI_CONF_DIR": "/etc/x", "NFTREDIR_CNI_BIN_DIR": "/ignored", "NFTREDIR_CNI_SOCKET": "/run/y.sock"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o, _, err := parse(CmdInstall, nil, envMap(map[string]string{"NFTREDIR_CNI_ONCE": "true", "NFTREDIR_CNI_CHECK": "true"}), io.Discard); err != nil || o.once || o.check {
		t.Errorf("--once and --check taken from the environment: %+v, %v", o, err)
	}
	if !slices.Equal(cfg.BinDirs, []string{"/a", "/b", "/c"}) || cfg.ConfDir != "/etc/x" {
		t.Errorf("dirs %v %s", cfg.BinDirs, cfg.ConfDir)
	}
	e := entryOf(t, cfg)
	if e["socket"] != "/run/y.sock" || e["logFile"] != "/var/log/x.log" || !jsonEqual(e["excludeNamespaces"], []string{}) {
		t.Errorf("entry %v", e)
	}
}

func TestParsePluginConfigFile(t *testing.T) {
	// The drop-in file serves as the entry: its cniVersion and name go.
	_, cfg, err := parse(CmdInstall, []string{"--plugin-config", "../../../../deploy/cni/99-nftredir.conf", "--timeout", "3s"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e := entryOf(t, cfg)
	if _, ok := e["cniVersion"]; ok {
		t.Error("cniVersion kept")
	}
	if e["timeout"] != "3s" || e["logFile"] != "/var/log/nftredir/cni.log" || e["type"] != PluginType {
		t.Errorf("entry %v", e)
	}
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	wrongType := filepath.Join(dir, "wrong.json")
	os.WriteFile(wrongType, []byte(`{"type":"bridge"}`), 0o644)
	for _, tc := range []struct {
		cmd  string
		args []string
		want string
	}{
		{CmdInstall, []string{"--cni-conf-dir", "rel"}, "absolute"},
		{CmdInstall, []string{"--socket", "rel.sock"}, "--socket"},
		{CmdInstall, []string{"--timeout", "0s"}, "--timeout"},
		{CmdInstall, []string{"--once", "--check"}, "exclude"},
		{CmdInstall, []string{"--plugin-config", wrongType}, "type"},
		{CmdInstall, []string{"--plugin-config", filepath.Join(dir, "absent")}, "--plugin-config"},
		{CmdInstall, []string{"extra"}, "unexpected"},
		{CmdUninstall, []string{"--once"}, "not defined"},
		{CmdInstall, []string{"--verbosity", "loud"}, "--verbosity"},
	} {
		if _, _, err := parse(tc.cmd, tc.args, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: %v, want %q", tc.cmd, tc.args, err, tc.want)
		}
	}
	var out strings.Builder
	if code := Main(CmdInstall, []string{"--help"}, noEnv, supported, &out); code != 0 || !strings.Contains(out.String(), "NFTREDIR_CNI_BIN_DIR") {
		t.Errorf("--help: exit %d\n%s", code, out.String())
	}
	if code := Main(CmdInstall, []string{"--bogus"}, noEnv, supported, io.Discard); code != 2 {
		t.Errorf("bad flag: exit %d", code)
	}
}

// TestMainInstallCheckUninstall drives the subcommands as a shell would,
// copying the plugin and the running binary (the helper's, in the image)
// as the real command does.
func TestMainInstallCheckUninstall(t *testing.T) {
	n := newNode(t)
	p := n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
	args := []string{"--cni-bin-dir", n.bin1 + "," + n.bin2, "--cni-conf-dir", n.conf, "--plugin-binary", n.src}
	var log bytes.Buffer
	if code := Main(CmdInstall, append(args, "--check"), noEnv, supported, &log); code != 1 {
		t.Errorf("--check before install: exit %d", code)
	}
	if code := Main(CmdInstall, append(args, "--once"), noEnv, supported, &log); code != 0 {
		t.Fatalf("install --once: exit %d\n%s", code, log.String())
	}
	self, _ := os.ReadFile("/proc/self/exe")
	if got, _ := os.ReadFile(filepath.Join(n.bin2, helper.Name)); !bytes.Equal(got, self) {
		t.Error("the installed helper is not the running binary")
	}
	if got, _ := os.ReadFile(filepath.Join(n.bin2, PluginType)); string(got) != "#!/bin/true\nplugin v1\n" {
		t.Errorf("the installed plugin is %q, not --plugin-binary's", got)
	}
	if code := Main(CmdInstall, append(args, "--check"), noEnv, supported, &log); code != 0 {
		t.Errorf("--check after install: exit %d\n%s", code, log.String())
	}
	// --check compares with the entry the flags describe.
	if code := Main(CmdInstall, append(args, "--check", "--timeout", "5s"), noEnv, supported, io.Discard); code != 1 {
		t.Errorf("--check with another entry: exit %d", code)
	}
	if code := Main(CmdUninstall, args, noEnv, supported, &log); code != 0 {
		t.Fatalf("uninstall: exit %d\n%s", code, log.String())
	}
	if len(readList(t, p).Plugins) != 2 {
		t.Error("entry left after uninstall")
	}
	if code := Main(CmdInstall, append(args, "--check"), noEnv, supported, io.Discard); code != 1 {
		t.Errorf("--check after uninstall: exit %d", code)
	}
}

// TestCleanupOnExit: SIGTERM leaves the plugin in place unless
// --cleanup-on-exit is set.
func TestCleanupOnExit(t *testing.T) {
	for _, cleanup := range []bool{false, true} {
		n := newNode(t)
		p := n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
		args := []string{"--cni-bin-dir", n.bin1, "--cni-conf-dir", n.conf, "--ready-file", n.ready, "--plugin-binary", n.src}
		if cleanup {
			args = append(args, "--cleanup-on-exit")
		}
		var log syncbuf.Buffer
		done := make(chan int, 1)
		go func() { done <- Main(CmdInstall, args, noEnv, supported, &log) }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(n.ready); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("never ready:\n%s", log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Main handles SIGTERM from here on: the ready file comes after
		// its signal handler is installed.
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("cleanup %v: exit %d\n%s", cleanup, code, log.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no exit after SIGTERM:\n%s", log.String())
		}
		_, binErr := os.Stat(filepath.Join(n.bin1, PluginType))
		chained := len(readList(t, p).Plugins) == 3
		if cleanup && (chained || !errors.Is(binErr, os.ErrNotExist)) {
			t.Errorf("--cleanup-on-exit: chained %v, binary %v", chained, binErr)
		}
		if !cleanup && (!chained || binErr != nil) {
			t.Errorf("plain exit: chained %v, binary %v", chained, binErr)
		}
		if _, err := os.Stat(n.ready); err == nil {
			t.Errorf("cleanup %v: ready file outlives the installer", cleanup)
		}
	}
}
