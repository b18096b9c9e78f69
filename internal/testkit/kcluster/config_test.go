package kcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/testenv"
)

// containerd warns about a key it does not know and goes on without it,
// so a misspelt or moved key would leave the cluster on a default
// unnoticed. containerd's own `config dump` (the configuration it would
// run with, migrated to its current version) must show every setting the
// cluster relies on.
func TestContainerdConfigTakesEffect(t *testing.T) {
	tools, err := toolsDir("")
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	for _, tc := range []struct {
		name string
		nri  NRIOptions
		want map[string][]string // section → its lines
	}{{
		name: "default",
		want: map[string][]string{
			"plugins.'io.containerd.nri.v1.nri'": {
				"disable = false",
				"socket_path = '{dir}/nri/nri.sock'",
				"plugin_path = '{dir}/nri/plugins'",
				"plugin_config_path = '{dir}/nri/conf.d'",
				"plugin_request_timeout = '2s'",
				"plugin_registration_timeout = '5s'",
			},
			"plugins.'io.containerd.nri.v1.nri'.default_validator": {"enable = false"},
			"plugins.'io.containerd.cri.v1.images'":                {"snapshotter = 'native'"},
			"plugins.'io.containerd.cri.v1.images'.pinned_images":  {"sandbox = '" + PauseImage + "'"},
			"plugins.'io.containerd.cri.v1.runtime'": {
				"restrict_oom_score_adj = true",
				"disable_apparmor = true",
				"cdi_spec_dirs = []",
			},
			"plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options": {
				"BinaryName = '" + filepath.Join(tools, "runc") + "'",
				"Root = '{dir}/runc'",
				"SystemdCgroup = false",
			},
			"plugins.'io.containerd.cri.v1.runtime'.cni": {
				"bin_dirs = ['{dir}/cni-bin']",
				"conf_dir = '{dir}/cni-conf'",
			},
			"plugins.'io.containerd.server.v1.grpc'":  {"address = '{dir}/containerd/containerd.sock'"},
			"plugins.'io.containerd.server.v1.ttrpc'": {"address = '{dir}/containerd/containerd.sock.ttrpc'"},
		},
	}, {
		name: "NRI options",
		nri: NRIOptions{
			RequestTimeout:      750 * time.Millisecond,
			RegistrationTimeout: 3 * time.Second,
			Validator:           &NRIValidator{RequiredPlugins: []string{"nftredir", "other"}, TolerateMissingPluginsAnnotation: "example.test/tolerate"},
		},
		want: map[string][]string{
			"plugins.'io.containerd.nri.v1.nri'": {
				"disable = false",
				"plugin_request_timeout = '750ms'",
				"plugin_registration_timeout = '3s'",
			},
			"plugins.'io.containerd.nri.v1.nri'.default_validator": {
				"enable = true",
				"required_plugins = ['nftredir', 'other']",
				"tolerate_missing_plugins_annotation = 'example.test/tolerate'",
			},
		},
	}, {
		name: "NRI off",
		nri:  NRIOptions{Disable: true},
		want: map[string][]string{
			"plugins.'io.containerd.nri.v1.nri'": {"disable = true"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cluster{Dir: t.TempDir(), tools: tools, opts: Options{NRI: tc.nri}}
			c.setPaths()
			cfg := filepath.Join(c.Dir, "config.toml")
			if err := os.WriteFile(cfg, []byte(c.containerdConfig()), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(c.bin("containerd"), "--config", cfg, "config", "dump").Output()
			if err != nil {
				t.Fatalf("containerd config dump: %v", err)
			}
			dump := tomlSections(string(out))
			for section, lines := range tc.want {
				for _, l := range lines {
					l = strings.ReplaceAll(l, "{dir}", c.Dir)
					if !dump[section][l] {
						t.Errorf("containerd runs with no %q in [%s]", l, section)
					}
				}
			}
			if t.Failed() {
				t.Logf("config:\n%s\ncontainerd config dump:\n%s", c.containerdConfig(), out)
			}
		})
	}
}

// tomlSections maps each [section] of a TOML document, as containerd
// writes it (one key per line), to its lines, trimmed.
func tomlSections(doc string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	cur := ""
	for _, l := range strings.Split(doc, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]") {
			cur = strings.Trim(l, "[]")
			continue
		}
		if out[cur] == nil {
			out[cur] = map[string]bool{}
		}
		out[cur][l] = true
	}
	return out
}
