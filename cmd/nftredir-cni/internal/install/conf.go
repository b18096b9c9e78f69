package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// PluginType is the "type" of the plugin's entry, the binary's name.
const PluginType = "nftredir-cni"

// confExtensions are the extensions libcni reads as configuration; the
// runtimes (containerd's CRI, CRI-O, podman's CNI backend) take the first
// such file of the directory in lexical order.
var confExtensions = []string{".conf", ".conflist", ".json"}

// ErrNoConfig means the configuration directory has no network yet: the
// primary CNI has not written its file. The watcher waits for it.
var ErrNoConfig = errors.New("no CNI network configuration yet")

// confFiles lists the configuration files of dir in the order libcni's
// ConfFiles gives them (os.ReadDir sorts by name). A missing dir has none.
func confFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range ents {
		if e.IsDir() || !slices.Contains(confExtensions, filepath.Ext(e.Name())) {
			continue
		}
		files = append(files, filepath.Join(dir, e.Name()))
	}
	return files, nil
}

// primaryFile is the file the runtime will use: name in dir when given,
// else the first configuration file.
func primaryFile(dir, name string) (string, error) {
	if name != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			// A .conf we converted lives on as .conflist.
			if filepath.Ext(name) == ".conf" {
				if _, err := os.Stat(p + "list"); err == nil {
					return p + "list", nil
				}
			}
			return "", fmt.Errorf("%w: %s does not exist", ErrNoConfig, p)
		} else if err != nil {
			return "", err
		}
		return p, nil
	}
	files, err := confFiles(dir)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("%w in %s", ErrNoConfig, dir)
	}
	return files[0], nil
}

// netConf is a network configuration file, kept as raw JSON so that every
// key and every other plugin's entry is written back as it was read.
type netConf struct {
	path string
	// top holds the top-level keys; for a single-plugin file, the plugin.
	top map[string]json.RawMessage
	// plugins is the conflist's chain; nil for a single-plugin file.
	plugins []json.RawMessage
	single  bool
	mode    fs.FileMode
	raw     []byte
}

func readConf(path string) (*netConf, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	c := &netConf{path: path, mode: fi.Mode().Perm(), raw: raw}
	if err := json.Unmarshal(raw, &c.top); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", path, err)
	}
	if c.top == nil {
		return nil, fmt.Errorf("%s: not a JSON object", path)
	}
	p, ok := c.top["plugins"]
	if !ok {
		// A single-plugin file (CNI < 1.0 "conf"), whatever its extension.
		if _, ok := c.top["type"]; !ok {
			return nil, fmt.Errorf("%s: neither a plugin list (\"plugins\") nor a plugin (\"type\")", path)
		}
		c.single = true
		return c, nil
	}
	if err := json.Unmarshal(p, &c.plugins); err != nil {
		return nil, fmt.Errorf("%s: \"plugins\" is not a list of objects: %w", path, err)
	}
	return c, nil
}

// version is the file's cniVersion, "" when it declares none.
func (c *netConf) version() (string, error) {
	v, ok := c.top["cniVersion"]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("%s: cniVersion is not a string", c.path)
	}
	return s, nil
}

func pluginType(raw json.RawMessage) string {
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return ""
	}
	return p.Type
}

// sameJSON compares two JSON values by meaning, not by spelling.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// withEntry returns the conflist content with entry chained, and whether
// that changes anything. An identical entry anywhere in the chain is left
// where it is, so a file already right is never rewritten; any other
// entry of ours is replaced by one at the end, after everything the
// primary CNI chains (portmap, bandwidth), as the plugin needs its
// prevResult.
func (c *netConf) withEntry(entry json.RawMessage) (top map[string]json.RawMessage, changed bool) {
	if c.single {
		// The conversion libcni's ConfListFromConf does: the list takes
		// the file's name and version; the plugin keeps its keys.
		top = map[string]json.RawMessage{"plugins": nil}
		for _, k := range []string{"cniVersion", "name"} {
			if v, ok := c.top[k]; ok {
				top[k] = v
			}
		}
		single, _ := json.Marshal(c.top)
		plugins := []json.RawMessage{single, entry}
		top["plugins"], _ = json.Marshal(plugins)
		return top, true
	}
	var kept []json.RawMessage
	for _, p := range c.plugins {
		if pluginType(p) != PluginType {
			kept = append(kept, p)
			continue
		}
		if sameJSON(p, entry) {
			return c.top, false
		}
	}
	top = maps.Clone(c.top)
	top["plugins"], _ = json.Marshal(append(kept, entry))
	return top, true
}

// withoutEntry returns the conflist without any entry of ours, and whether
// there was one.
func (c *netConf) withoutEntry() (top map[string]json.RawMessage, changed bool) {
	if c.single {
		return c.top, false
	}
	var kept []json.RawMessage
	for _, p := range c.plugins {
		if pluginType(p) == PluginType {
			changed = true
			continue
		}
		kept = append(kept, p)
	}
	if !changed {
		return c.top, false
	}
	if kept == nil {
		kept = []json.RawMessage{}
	}
	top = maps.Clone(c.top)
	top["plugins"], _ = json.Marshal(kept)
	return top, true
}

// hasAny reports whether the list chains the plugin in any form.
func (c *netConf) hasAny() bool {
	for _, p := range c.plugins {
		if pluginType(p) == PluginType {
			return true
		}
	}
	return false
}

func (c *netConf) hasEntry(entry json.RawMessage) bool {
	for _, p := range c.plugins {
		if pluginType(p) == PluginType && sameJSON(p, entry) {
			return true
		}
	}
	return false
}

// render indents like the files primary CNIs write, so a diff of the file
// before and after shows the one entry.
func render(top map[string]json.RawMessage) ([]byte, error) {
	compact, err := json.Marshal(top)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, compact, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// checkVersion refuses a file whose version the plugin does not speak:
// chaining it there would fail every pod's ADD on an incompatible
// version. A file that declares no version is left to its runtime.
func checkVersion(path, v string, supported []string) error {
	if v == "" || slices.Contains(supported, v) {
		return nil
	}
	return fmt.Errorf("%s declares cniVersion %s, which %s does not speak (it speaks %s); not chaining it there",
		path, v, PluginType, strings.Join(supported, ", "))
}
