package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
)

var supported = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

const testEntry = `{"type":"nftredir-cni","socket":"/run/nftredir/nftredir.sock","timeout":"10s","excludeNamespaces":["kube-system"]}`

// node is a scratch CNI layout: a conf dir, two bin dirs, a binary.
type node struct {
	conf, bin1, bin2, src, helperSrc, ready string
}

func newNode(t *testing.T) *node {
	t.Helper()
	d := t.TempDir()
	n := &node{conf: filepath.Join(d, "net.d"), bin1: filepath.Join(d, "opt-cni-bin"), bin2: filepath.Join(d, "usr-lib-cni"),
		src: filepath.Join(d, "src-binary"), helperSrc: filepath.Join(d, "src-helper"), ready: filepath.Join(d, "ready")}
	for _, dir := range []string{n.conf, n.bin1, n.bin2} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(n.src, []byte("#!/bin/true\nplugin v1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.helperSrc, []byte("#!/bin/true\nhelper v1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *node) config() Config {
	return Config{BinDirs: []string{n.bin1, n.bin2}, ConfDir: n.conf, Entry: json.RawMessage(testEntry),
		Source: n.src, HelperSource: n.helperSrc, Supported: supported, ReadyFile: n.ready, Logger: hclog.NewNullLogger()}
}

func (n *node) installer(t *testing.T) *Installer {
	t.Helper()
	in, err := New(n.config())
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (n *node) fixture(t *testing.T, fixture, as string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(n.conf, as)
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// list is a conflist as the tests inspect it.
type list struct {
	CNIVersion *string          `json:"cniVersion"`
	Name       string           `json:"name"`
	Plugins    []map[string]any `json:"plugins"`
}

func readList(t *testing.T, path string) list {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var l list
	if err := json.Unmarshal(raw, &l); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, raw)
	}
	return l
}

func types(l list) []string {
	var out []string
	for _, p := range l.Plugins {
		out = append(out, p["type"].(string))
	}
	return out
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestInsertMatchesVersion(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			n := newNode(t)
			p := n.fixture(t, v+".conflist", "10-mynet.conflist")
			in := n.installer(t)
			if in.Ready() {
				t.Fatal("ready before any sync")
			}
			if err := Check(n.config()); err == nil {
				t.Fatal("Check passes before install")
			}
			if err := in.Sync(); err != nil {
				t.Fatal(err)
			}
			l := readList(t, p)
			if l.CNIVersion == nil || *l.CNIVersion != v {
				t.Errorf("cniVersion %v, want %s unchanged", l.CNIVersion, v)
			}
			if got := strings.Join(types(l), ","); got != "bridge,portmap,nftredir-cni" {
				t.Errorf("chain %s", got)
			}
			ours := l.Plugins[2]
			if _, ok := ours["cniVersion"]; ok {
				t.Error("the entry carries a cniVersion")
			}
			if ours["socket"] != "/run/nftredir/nftredir.sock" || ours["timeout"] != "10s" {
				t.Errorf("entry %v", ours)
			}
			// The primary's entries are kept key for key.
			if l.Plugins[0]["bridge"] != "cni0" || l.Plugins[1]["capabilities"].(map[string]any)["portMappings"] != true {
				t.Errorf("primary plugins changed: %v", l.Plugins[:2])
			}
			if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
				t.Errorf("mode %#o, want the file's 0644", fi.Mode().Perm())
			}
			for _, d := range []string{n.bin1, n.bin2} {
				for name, want := range map[string]string{PluginType: "plugin v1", helper.Name: "helper v1"} {
					b, err := os.ReadFile(filepath.Join(d, name))
					if err != nil || string(b) != "#!/bin/true\n"+want+"\n" {
						t.Errorf("%s: %s %q, %v", d, name, b, err)
					}
					if fi, _ := os.Stat(filepath.Join(d, name)); fi.Mode().Perm() != 0o755 {
						t.Errorf("%s mode %#o", name, fi.Mode().Perm())
					}
				}
			}
			if !in.Ready() {
				t.Error("not ready after a successful sync")
			}
			if _, err := os.Stat(n.ready); err != nil {
				t.Errorf("ready file: %v", err)
			}
			if err := Check(n.config()); err != nil {
				t.Errorf("Check after install: %v", err)
			}
			noTemps(t, n)
		})
	}
}

func noTemps(t *testing.T, n *node) {
	t.Helper()
	for _, d := range []string{n.conf, n.bin1, n.bin2} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				t.Errorf("temporary file left: %s/%s", d, e.Name())
			}
		}
	}
}

// 0.2.0 has no plugin lists and no prevResult: every ADD would fail.
func TestRefusesVersionThePluginDoesNotSpeak(t *testing.T) {
	n := newNode(t)
	p := filepath.Join(n.conf, "10-mynet.conf")
	before := []byte(`{"cniVersion":"0.2.0","name":"old","type":"bridge","ipam":{"type":"host-local","subnet":"10.1.0.0/24"}}`)
	os.WriteFile(p, before, 0o644)
	in := n.installer(t)
	err := in.Sync()
	if err == nil || !strings.Contains(err.Error(), "cniVersion 0.2.0") {
		t.Fatalf("sync of a 0.2.0 network: %v", err)
	}
	if after, _ := os.ReadFile(p); !bytes.Equal(before, after) {
		t.Error("the 0.2.0 file was changed")
	}
	if in.Ready() {
		t.Error("ready although the plugin is not chained")
	}
	if _, err := os.Stat(n.ready); err == nil {
		t.Error("ready file exists")
	}
}

func TestNoVersionDeclaredIsNotAdded(t *testing.T) {
	n := newNode(t)
	p := n.fixture(t, "noversion.conflist", "10-old.conflist")
	if err := n.installer(t).Sync(); err != nil {
		t.Fatal(err)
	}
	l := readList(t, p)
	if l.CNIVersion != nil {
		t.Errorf("cniVersion %q added", *l.CNIVersion)
	}
	if got := strings.Join(types(l), ","); got != "bridge,nftredir-cni" {
		t.Errorf("chain %s", got)
	}
}

func TestAlreadyInstalledIsNotRewritten(t *testing.T) {
	n := newNode(t)
	p := n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
	in := n.installer(t)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	ino, bino := inode(t, p), inode(t, filepath.Join(n.bin1, PluginType))
	before, _ := os.ReadFile(p)
	// A fresh installer (a restarted pod) finds it all in place.
	in2 := n.installer(t)
	for range 3 {
		if err := in2.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if inode(t, p) != ino || inode(t, filepath.Join(n.bin1, PluginType)) != bino {
		t.Error("an installed node was rewritten")
	}
	after, _ := os.ReadFile(p)
	if !bytes.Equal(before, after) {
		t.Errorf("content changed:\n%s\n%s", before, after)
	}
	if !in2.Ready() {
		t.Error("not ready")
	}
}

func TestStaleEntryIsReplacedAtTheEnd(t *testing.T) {
	n := newNode(t)
	p := filepath.Join(n.conf, "10-mynet.conflist")
	os.WriteFile(p, []byte(`{"cniVersion":"1.0.0","name":"mynet","plugins":[
		{"type":"bridge","bridge":"cni0"},
		{"type":"nftredir-cni","socket":"/old.sock"},
		{"type":"portmap","capabilities":{"portMappings":true}}]}`), 0o644)
	if err := n.installer(t).Sync(); err != nil {
		t.Fatal(err)
	}
	l := readList(t, p)
	if got := strings.Join(types(l), ","); got != "bridge,portmap,nftredir-cni" {
		t.Errorf("chain %s", got)
	}
	if l.Plugins[2]["socket"] != "/run/nftredir/nftredir.sock" {
		t.Errorf("stale entry kept: %v", l.Plugins[2])
	}
}

func TestRewrittenByPrimaryIsRepaired(t *testing.T) {
	n := newNode(t)
	p := n.fixture(t, "1.1.0.conflist", "10-mynet.conflist")
	in := n.installer(t)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	// The primary CNI writes its own file again (an agent restart).
	n.fixture(t, "1.1.0.conflist", "10-mynet.conflist")
	if err := Check(n.config()); err == nil {
		t.Fatal("Check passes on the rewritten file")
	}
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(types(readList(t, p)), ","); got != "bridge,portmap,nftredir-cni" {
		t.Errorf("chain after repair %s", got)
	}
}

func TestSingleConfIsConverted(t *testing.T) {
	n := newNode(t)
	conf := n.fixture(t, "single.conf", "10-flannel.conf")
	in := n.installer(t)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(conf); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the .conf is still there: %v", err)
	}
	l := readList(t, conf+"list")
	if l.CNIVersion == nil || *l.CNIVersion != "0.4.0" || l.Name != "flannel-like" {
		t.Errorf("list header %v %q", l.CNIVersion, l.Name)
	}
	if got := strings.Join(types(l), ","); got != "bridge,nftredir-cni" {
		t.Errorf("chain %s", got)
	}
	if l.Plugins[0]["ipam"].(map[string]any)["subnet"] != "10.244.0.0/24" {
		t.Errorf("primary plugin changed: %v", l.Plugins[0])
	}
	if err := Check(n.config()); err != nil {
		t.Errorf("Check: %v", err)
	}
	// The primary CNI writes its .conf again: it sorts first, so it is
	// what the runtime would use; it is converted again.
	n.fixture(t, "single.conf", "10-flannel.conf")
	if err := Check(n.config()); err == nil {
		t.Error("Check passes while the bare .conf is first")
	}
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(conf); !errors.Is(err, os.ErrNotExist) {
		t.Error("the rewritten .conf is still there")
	}
	// An explicit --cni-conf-name of the .conf follows the conversion.
	cfg := n.config()
	cfg.ConfName = "10-flannel.conf"
	if err := Check(cfg); err != nil {
		t.Errorf("Check by the .conf's name: %v", err)
	}
}

func TestPicksTheFirstFileLikeLibcni(t *testing.T) {
	n := newNode(t)
	first := n.fixture(t, "1.0.0.conflist", "05-first.conflist")
	second := n.fixture(t, "1.0.0.conflist", "10-second.conflist")
	// Neither directories nor other extensions are configuration.
	os.MkdirAll(filepath.Join(n.conf, "00-dir.conflist"), 0o755)
	os.WriteFile(filepath.Join(n.conf, "00-readme.txt"), []byte("x"), 0o644)
	if err := n.installer(t).Sync(); err != nil {
		t.Fatal(err)
	}
	if len(readList(t, first).Plugins) != 3 || len(readList(t, second).Plugins) != 2 {
		t.Error("did not chain into the first file only")
	}
	// --cni-conf-name chooses another.
	cfg := n.config()
	cfg.ConfName = "10-second.conflist"
	in, _ := New(cfg)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(readList(t, second).Plugins) != 3 {
		t.Error("--cni-conf-name ignored")
	}
}

func TestNoConfigYetThenOneAppears(t *testing.T) {
	n := newNode(t)
	in := n.installer(t)
	err := in.Sync()
	if !errors.Is(err, ErrNoConfig) || in.Ready() {
		t.Fatalf("empty conf dir: %v, ready %v", err, in.Ready())
	}
	// The binary is in place already, ready for the network.
	if _, err := os.Stat(filepath.Join(n.bin1, PluginType)); err != nil {
		t.Error(err)
	}
	p := n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
	if err := in.Sync(); err != nil || !in.Ready() {
		t.Fatalf("after the network appeared: %v, ready %v", err, in.Ready())
	}
	if len(readList(t, p).Plugins) != 3 {
		t.Error("not chained")
	}
}

func TestBinDirs(t *testing.T) {
	n := newNode(t)
	n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
	cfg := n.config()
	missing := filepath.Join(t.TempDir(), "absent")
	cfg.BinDirs = []string{missing, n.bin1}
	in, _ := New(cfg)
	if err := in.Sync(); err != nil {
		t.Fatalf("a missing bin dir among existing ones: %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Error("a missing bin dir was created")
	}
	cfg.BinDirs = []string{missing}
	in, _ = New(cfg)
	if err := in.Sync(); err == nil || !strings.Contains(err.Error(), "none of the CNI binary directories") {
		t.Errorf("no bin dir: %v", err)
	}
	// A new build replaces the binary (a new inode, never written in place).
	cfg = n.config()
	in, _ = New(cfg)
	in.Sync()
	ino := inode(t, filepath.Join(n.bin1, PluginType))
	os.WriteFile(n.src, []byte("plugin v2"), 0o700)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(n.bin1, PluginType)); string(b) != "plugin v2" {
		t.Errorf("binary not updated: %q", b)
	}
	if inode(t, filepath.Join(n.bin1, PluginType)) == ino {
		t.Error("binary rewritten in place, not replaced")
	}
	// Same size, other bytes.
	os.WriteFile(n.src, []byte("plugin v3"), 0o700)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(n.bin1, PluginType)); string(b) != "plugin v3" {
		t.Errorf("binary of the same size not updated: %q", b)
	}
}

// The helper goes in before the plugin: a plugin the runtime can run
// always finds the helper it runs when the daemon cannot answer.
func TestHelperBeforePlugin(t *testing.T) {
	n := newNode(t)
	n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
	cfg := n.config()
	cfg.Source = filepath.Join(t.TempDir(), "unreadable")
	in, _ := New(cfg)
	if err := in.Sync(); err == nil {
		t.Fatal("Sync with no plugin to copy succeeded")
	}
	if _, err := os.Stat(filepath.Join(n.bin1, helper.Name)); err != nil {
		t.Errorf("helper not installed before the plugin: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.bin1, PluginType)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin installed from nowhere: %v", err)
	}
}

func TestUninstall(t *testing.T) {
	n := newNode(t)
	p := n.fixture(t, "1.0.0.conflist", "10-mynet.conflist")
	other := filepath.Join(n.conf, "20-other.conflist")
	os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"ptp"},{"type":"nftredir-cni","socket":"/x.sock"}]}`), 0o600)
	broken := filepath.Join(n.conf, "30-broken.conf")
	os.WriteFile(broken, []byte(`{not json`), 0o644)
	in := n.installer(t)
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // repeatable
		if err := in.Uninstall(); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(types(readList(t, p)), ","); got != "bridge,portmap" {
			t.Errorf("primary chain after uninstall %s", got)
		}
		if got := strings.Join(types(readList(t, other)), ","); got != "ptp" {
			t.Errorf("other network after uninstall %s", got)
		}
		if fi, _ := os.Stat(other); fi.Mode().Perm() != 0o600 {
			t.Errorf("mode of the other network %#o", fi.Mode().Perm())
		}
		for _, d := range []string{n.bin1, n.bin2} {
			for _, name := range []string{PluginType, helper.Name} {
				if _, err := os.Stat(filepath.Join(d, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left in %s", name, d)
				}
			}
		}
		if in.Ready() {
			t.Error("ready after uninstall")
		}
		if _, err := os.Stat(n.ready); err == nil {
			t.Error("ready file left")
		}
	}
	if b, _ := os.ReadFile(broken); string(b) != "{not json" {
		t.Error("an unreadable file was touched")
	}
	noTemps(t, n)
}

func TestConfigChecks(t *testing.T) {
	n := newNode(t)
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Entry = json.RawMessage(`{"type":"other"}`) }, "type must be"},
		{func(c *Config) { c.Entry = json.RawMessage(`{"type":"nftredir-cni","cniVersion":"1.0.0"}`) }, "cniVersion"},
		{func(c *Config) { c.Entry = json.RawMessage(`[1]`) }, "not a JSON object"},
		{func(c *Config) { c.BinDirs = nil }, "no CNI binary directory"},
		{func(c *Config) { c.ConfDir = "etc/cni" }, "absolute"},
		{func(c *Config) { c.ConfName = "../x.conflist" }, "file name"},
	} {
		cfg := n.config()
		tc.edit(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

// TestWatcher runs the installer against a real directory as a DaemonSet
// would: the network appears after it starts, the primary CNI rewrites
// its file, and the installer's own writes do not start a loop.
func TestWatcher(t *testing.T) {
	n := newNode(t)
	in := n.installer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx, time.Hour) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the binary", func() bool { _, err := os.Stat(filepath.Join(n.bin1, PluginType)); return err == nil })
	if in.Ready() {
		t.Fatal("ready with no network")
	}
	p := filepath.Join(n.conf, "10-mynet.conflist")
	raw, _ := os.ReadFile("testdata/1.0.0.conflist")
	// The primary CNI writes atomically, as containerd's and Calico's do.
	primaryWrite := func() {
		tmp := filepath.Join(n.conf, ".primary.tmp")
		os.WriteFile(tmp, raw, 0o644)
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	}
	primaryWrite()
	chained := func() bool { return Check(n.config()) == nil && in.Ready() }
	waitFor("the plugin chained into the new network", chained)

	primaryWrite()
	waitFor("the plugin chained again after the rewrite", chained)

	// And again with a non-atomic write (truncate, then write).
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the plugin chained again after an in-place write", chained)

	// Settled: no more writes of our own.
	ino := inode(t, p)
	time.Sleep(10 * settle)
	if inode(t, p) != ino {
		t.Error("the installer keeps rewriting a file already right")
	}

	// The binary deleted by hand comes back.
	os.Remove(filepath.Join(n.bin2, PluginType))
	waitFor("the binary back", func() bool { _, err := os.Stat(filepath.Join(n.bin2, PluginType)); return err == nil })
}

// With a backup dir, uninstall puts back the primary CNI's own bytes,
// odd spacing and key order included; if the network changed meanwhile in
// more than our entry, it is re-encoded without the entry instead.
func TestUninstallRestoresTheOriginalBytes(t *testing.T) {
	orig := "{ \"name\": \"mynet\",\n\t\"cniVersion\": \"1.0.0\",\n  \"plugins\": [ {\"type\": \"bridge\", \"bridge\": \"cni0\"} ] }\n"
	for _, changed := range []bool{false, true} {
		n := newNode(t)
		p := filepath.Join(n.conf, "10-mynet.conflist")
		os.WriteFile(p, []byte(orig), 0o640)
		cfg := n.config()
		cfg.BackupDir = filepath.Join(n.conf, "..", "backup")
		in, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Sync(); err != nil {
			t.Fatal(err)
		}
		// A second installer (the next pod of the DaemonSet) finds the
		// entry in place and must not take the chained file as original.
		in2, _ := New(cfg)
		if err := in2.Sync(); err != nil {
			t.Fatal(err)
		}
		if changed {
			l := readList(t, p)
			l.Plugins[0]["bridge"] = "cni1"
			b, _ := json.Marshal(l)
			os.WriteFile(p, b, 0o640)
		}
		if err := in2.Uninstall(); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		switch {
		case !changed && string(got) != orig:
			t.Errorf("after uninstall:\n%s\nwant the original bytes:\n%s", got, orig)
		case changed && (strings.Join(types(readList(t, p)), ",") != "bridge" || readList(t, p).Plugins[0]["bridge"] != "cni1"):
			t.Errorf("changed network after uninstall: %s", got)
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
			t.Errorf("mode %#o", fi.Mode().Perm())
		}
		if _, err := os.Stat(cfg.BackupDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("backup dir left after uninstall: %v", err)
		}
	}
}

// With NRI enrolment the plugin stays chained until the daemon has
// registered with a runtime whose validator holds pods back (the gate
// file), then leaves every network with the primary's own bytes back,
// and is chained again if the gate goes: the node always has one door.
func TestNRIGateUnchains(t *testing.T) {
	orig := "{ \"name\": \"mynet\", \"cniVersion\": \"1.0.0\", \"plugins\": [ {\"type\": \"bridge\"} ] }\n"
	n := newNode(t)
	p := filepath.Join(n.conf, "10-mynet.conflist")
	if err := os.WriteFile(p, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := n.config()
	cfg.BackupDir = filepath.Join(n.conf, "..", "backup")
	cfg.NRIGateFile = filepath.Join(n.conf, "..", "run", "nri-gate")
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(types(readList(t, p)), ","); got != "bridge,nftredir-cni" || !in.Ready() {
		t.Fatalf("no gate yet: chain %s, ready %v; want the plugin chained", got, in.Ready())
	}
	if err := os.MkdirAll(filepath.Dir(cfg.NRIGateFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.NRIGateFile, []byte("containerd v2.4.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); string(got) != orig || !in.Ready() {
		t.Fatalf("gate in place: network %q, ready %v; want the primary's own bytes back, ready", got, in.Ready())
	}
	if err := Check(cfg); err != nil {
		t.Errorf("Check with the gate in place and the plugin unchained: %v", err)
	}
	for _, d := range []string{n.bin1, n.bin2} {
		if _, err := os.Stat(filepath.Join(d, PluginType)); err != nil {
			t.Errorf("binary gone from %s: %v; a switch back to the CNI chain needs it", d, err)
		}
	}
	if err := os.Remove(cfg.NRIGateFile); err != nil {
		t.Fatal(err)
	}
	if err := in.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(types(readList(t, p)), ","); got != "bridge,nftredir-cni" {
		t.Errorf("gate gone: chain %s; want the plugin chained again", got)
	}
}
