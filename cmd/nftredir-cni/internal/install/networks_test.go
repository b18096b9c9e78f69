package install

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/plugin"
)

var update = flag.Bool("update", false, "rewrite testdata/networks/golden from the installer's output")

// The real default networks of testdata/networks (see its README), each
// alone in the configuration directory as on a fresh node.
var defaultNetworks = []struct {
	file   string
	chain  string // plugin types after install
	result string // the file chained into
}{
	{"10-flannel.conflist", "flannel,portmap,nftredir-cni", "10-flannel.conflist"},
	{"10-calico.conflist", "calico,portmap,nftredir-cni", "10-calico.conflist"},
	{"05-cilium.conflist", "cilium-cni,nftredir-cni", "05-cilium.conflist"},
	{"10-kindnet.conflist", "ptp,portmap,nftredir-cni", "10-kindnet.conflist"},
	{"00-multus.conf", "multus,nftredir-cni", "00-multus.conflist"},
	{"00-multus-thick.conf", "multus-shim,nftredir-cni", "00-multus-thick.conflist"},
}

// TestInstallIntoDefaultNetworks chains the plugin into each primary CNI's
// real default network, all of them 0.3.1: the file keeps its version and
// every key of the primary's plugins, the entry comes last without a
// version of its own, the result matches its golden, a second install
// changes nothing, and uninstall leaves the primary's plugins as they were.
func TestInstallIntoDefaultNetworks(t *testing.T) {
	for _, tc := range defaultNetworks {
		t.Run(tc.file, func(t *testing.T) {
			n := newNode(t)
			orig, err := os.ReadFile(filepath.Join("testdata", "networks", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(n.conf, tc.file), orig, 0o644); err != nil {
				t.Fatal(err)
			}
			in := n.installer(t)
			if err := in.Sync(); err != nil {
				t.Fatalf("install: %v", err)
			}
			p := filepath.Join(n.conf, tc.result)
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "networks", "golden", tc.result+".golden")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from %s:\n%s", tc.result, golden, got)
			}

			l := readList(t, p)
			if l.CNIVersion == nil || *l.CNIVersion != "0.3.1" {
				t.Errorf("cniVersion %v, want 0.3.1 kept", l.CNIVersion)
			}
			if g := strings.Join(types(l), ","); g != tc.chain {
				t.Errorf("chain %s, want %s", g, tc.chain)
			}
			if _, ok := l.Plugins[len(l.Plugins)-1]["cniVersion"]; ok {
				t.Error("the entry carries a cniVersion of its own")
			}
			// The primary's plugins are kept key for key: the single
			// plugin of a .conf, or every plugin of the list.
			var before []any
			var o map[string]any
			json.Unmarshal(orig, &o)
			if ps, ok := o["plugins"].([]any); ok {
				before = ps
			} else {
				before = []any{o}
			}
			var after map[string]any
			json.Unmarshal(got, &after)
			if a, _ := json.Marshal(after["plugins"].([]any)[:len(before)]); !sameJSON(a, mustJSON(before)) {
				t.Errorf("the primary's plugins changed:\n%s\nwas\n%s", a, mustJSON(before))
			}
			if err := Check(n.config()); err != nil {
				t.Errorf("Check: %v", err)
			}
			ino := inode(t, p)
			if err := n.installer(t).Sync(); err != nil || inode(t, p) != ino {
				t.Errorf("a second install rewrote the file (%v)", err)
			}
			if err := in.Uninstall(); err != nil {
				t.Fatal(err)
			}
			left, _ := os.ReadFile(p)
			var l2 map[string]any
			json.Unmarshal(left, &l2)
			if !sameJSON(mustJSON(l2["plugins"]), mustJSON(before)) {
				t.Errorf("after uninstall:\n%s", left)
			}
		})
	}
}

// chained counts the plugin's entries on a sandbox's path through the
// directory's networks: top-level entries in every file and entries in
// Multus' inline delegates.
func chained(t *testing.T, dir string) map[string]int {
	t.Helper()
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.conf*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), `"type":"nftredir-cni"`) + strings.Count(string(b), `"type": "nftredir-cni"`); n > 0 {
			out[filepath.Base(f)] = n
		}
	}
	return out
}

// TestMultusChainsOnce installs onto a node where Multus was installed
// after nftredir: the Calico network already chains the plugin, and
// Multus' thin installer copied it into its delegates (the state of
// istio#57432, where the plugin then ran twice per pod). The plugin ends up
// once, after Multus; Multus regenerating its file from the Calico one
// keeps it that way.
func TestMultusChainsOnce(t *testing.T) {
	for _, multusFile := range []string{"00-multus.conf", "00-multus-thick.conf"} {
		t.Run(multusFile, func(t *testing.T) {
			n := newNode(t)
			// nftredir was chained into Calico's network first.
			n.fixture(t, "networks/10-calico.conflist", "10-calico.conflist")
			first := n.installer(t)
			if err := first.Sync(); err != nil {
				t.Fatal(err)
			}
			calico, _ := os.ReadFile(filepath.Join(n.conf, "10-calico.conflist"))
			// Multus arrives; the thin one embeds the Calico network as it
			// is now, entry included.
			multus, err := os.ReadFile(filepath.Join("testdata", "networks", multusFile))
			if err != nil {
				t.Fatal(err)
			}
			if multusFile == "00-multus.conf" {
				multus = withDelegate(t, multus, calico)
			}
			os.WriteFile(filepath.Join(n.conf, multusFile), multus, 0o644)
			if err := Check(n.config()); err == nil {
				t.Fatal("Check passes with the plugin only inside Multus' delegate")
			}
			if err := n.installer(t).Sync(); err != nil {
				t.Fatal(err)
			}
			list := strings.TrimSuffix(multusFile, ".conf") + ".conflist"
			if got := chained(t, n.conf); len(got) != 1 || got[list] != 1 {
				t.Fatalf("entries per file %v, want one, in %s", got, list)
			}
			l := readList(t, filepath.Join(n.conf, list))
			want := "multus,nftredir-cni"
			if multusFile == "00-multus-thick.conf" {
				want = "multus-shim,nftredir-cni"
			}
			if got := strings.Join(types(l), ","); got != want {
				t.Errorf("Multus chain %s, want %s", got, want)
			}
			if err := Check(n.config()); err != nil {
				t.Errorf("Check: %v", err)
			}

			// Before uninstalling, a duplicate put back by hand into the
			// Calico network is seen by Check and removed by the next sync.
			os.WriteFile(filepath.Join(n.conf, "10-calico.conflist"), calico, 0o644)
			if err := Check(n.config()); err == nil || !strings.Contains(err.Error(), "run twice") {
				t.Errorf("Check with the plugin in Calico's network too: %v", err)
			}
			if err := n.installer(t).Sync(); err != nil {
				t.Fatal(err)
			}
			if got := chained(t, n.conf); len(got) != 1 || got[list] != 1 {
				t.Errorf("after repair: entries per file %v", got)
			}
			if multusFile != "00-multus.conf" {
				return
			}
			// Multus' thin installer sees its master changed and writes its
			// .conf again from it: no entry anywhere until the next sync,
			// which chains it after Multus again.
			calicoNow, _ := os.ReadFile(filepath.Join(n.conf, "10-calico.conflist"))
			raw, _ := os.ReadFile(filepath.Join("testdata", "networks", multusFile))
			os.WriteFile(filepath.Join(n.conf, multusFile), withDelegate(t, raw, calicoNow), 0o644)
			if err := n.installer(t).Sync(); err != nil {
				t.Fatal(err)
			}
			if got := chained(t, n.conf); len(got) != 1 || got[list] != 1 {
				t.Errorf("after Multus regenerated its file: entries per file %v", got)
			}
			if _, err := os.Stat(filepath.Join(n.conf, multusFile)); !os.IsNotExist(err) {
				t.Errorf("Multus' regenerated .conf still there: %v", err)
			}
		})
	}
}

// withDelegate replaces the thin Multus file's inline delegate with the
// master network, compact, as its entrypoint writes it.
func withDelegate(t *testing.T, multus, master []byte) []byte {
	t.Helper()
	var m any
	if err := json.Unmarshal(master, &m); err != nil {
		t.Fatal(err)
	}
	compact, _ := json.Marshal(m)
	lines := strings.Split(string(multus), "\n")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), `{"cniVersion"`) {
			lines[i] = "                " + string(compact)
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// The binary gives the installer the plugin's own Versions: each default
// network must be one of them, or install refuses it.
func TestPluginSpeaksEveryDefaultNetwork(t *testing.T) {
	for _, tc := range defaultNetworks {
		c, err := readConf(filepath.Join("testdata", "networks", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		v, err := c.version()
		if err != nil {
			t.Fatal(err)
		}
		if err := checkVersion(tc.file, v, plugin.Versions.SupportedVersions()); err != nil {
			t.Error(err)
		}
	}
}
