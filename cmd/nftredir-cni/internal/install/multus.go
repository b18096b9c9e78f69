package install

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Multus is a meta plugin: the network the runtime runs is Multus, and
// Multus runs the cluster network (its first delegate: an inline copy in
// "delegates", which its thin installer regenerates from the cluster
// network's file, or a file or NetworkAttachmentDefinition named by
// "clusterNetwork") and then the pod's additional networks.
//
// The plugin is chained after Multus in Multus' own network, like after
// any primary plugin: that is the network every sandbox passes through,
// once, whatever Multus delegates to, and Multus' result is the cluster
// network's. It must then be nowhere else on the pod's path, or it runs
// twice for one sandbox (istio#57432: istio-cni inserted into both the
// Multus and the Calico conflist, after Multus had embedded the Calico one
// as its delegate). So with Multus as the primary network the installer
// also removes the plugin's entry from Multus' inline delegates and from
// every other network file of the directory, which Multus may read as its
// cluster network.
var multusTypes = []string{"multus", "multus-shim"}

// multus reports whether the network is Multus' delegating form.
func (c *netConf) multus() bool {
	if c.single {
		return slices.Contains(multusTypes, pluginType(mustJSON(c.top)))
	}
	return slices.ContainsFunc(c.plugins, func(p json.RawMessage) bool {
		return slices.Contains(multusTypes, pluginType(p))
	})
}

// withoutDelegateEntries removes the plugin's entry from the inline
// delegates of the network's Multus plugin, in place, and reports whether
// there was one.
func (c *netConf) withoutDelegateEntries() (bool, error) {
	if c.single {
		out, changed, err := stripDelegates(mustJSON(c.top))
		if err != nil || !changed {
			return false, err
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(out, &top); err != nil {
			return false, err
		}
		c.top = top
		return true, nil
	}
	found := false
	for i, p := range c.plugins {
		if !slices.Contains(multusTypes, pluginType(p)) {
			continue
		}
		out, changed, err := stripDelegates(p)
		if err != nil {
			return false, err
		}
		if changed {
			c.plugins[i], found = out, true
		}
	}
	if found {
		c.top = maps.Clone(c.top)
		c.top["plugins"] = mustJSON(c.plugins)
	}
	return found, nil
}

// stripDelegates removes the plugin from a Multus plugin's delegates: a
// delegate that is the plugin itself, or the plugin's entry in a delegate
// that is a plugin list.
func stripDelegates(plugin json.RawMessage) (json.RawMessage, bool, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(plugin, &m); err != nil {
		return nil, false, err
	}
	raw, ok := m["delegates"]
	if !ok {
		return plugin, false, nil
	}
	var delegates []json.RawMessage
	if err := json.Unmarshal(raw, &delegates); err != nil {
		return nil, false, fmt.Errorf("multus \"delegates\" is not a list of objects: %w", err)
	}
	changed := false
	kept := []json.RawMessage{}
	for _, d := range delegates {
		if pluginType(d) == PluginType {
			changed = true
			continue
		}
		var dm map[string]json.RawMessage
		if err := json.Unmarshal(d, &dm); err != nil || dm == nil {
			kept = append(kept, d)
			continue
		}
		if _, ok := dm["plugins"]; ok {
			dc := &netConf{top: dm}
			if err := json.Unmarshal(dm["plugins"], &dc.plugins); err == nil {
				if top, ch := dc.withoutEntry(); ch {
					d, changed = mustJSON(top), true
				}
			}
		}
		kept = append(kept, d)
	}
	if !changed {
		return plugin, false, nil
	}
	m["delegates"] = mustJSON(kept)
	return mustJSON(m), true, nil
}

// delegatedEntries lists where, besides the primary network, the plugin
// would run again for a sandbox of a Multus primary: its inline delegates
// and the other network files of dir.
func delegatedEntries(dir string, primary *netConf) ([]string, error) {
	var where []string
	if changed, err := primary.clone().withoutDelegateEntries(); err != nil {
		return nil, err
	} else if changed {
		where = append(where, primary.path+" (Multus delegates)")
	}
	others, err := otherNetworks(dir, primary.path)
	if err != nil {
		return nil, err
	}
	for _, o := range others {
		if _, changed := o.withoutEntry(); changed {
			where = append(where, o.path)
		}
	}
	return where, nil
}

func (c *netConf) clone() *netConf {
	d := *c
	d.top = maps.Clone(c.top)
	d.plugins = slices.Clone(c.plugins)
	return &d
}

// otherNetworks reads the network files of dir but skip; unreadable ones
// are not networks any runtime or Multus loads, and are left alone.
func otherNetworks(dir, skip string) ([]*netConf, error) {
	files, err := confFiles(dir)
	if err != nil {
		return nil, err
	}
	var out []*netConf
	for _, f := range files {
		if f == skip {
			continue
		}
		c, err := readConf(f)
		if err != nil {
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// mustJSON marshals values that came from JSON and so always marshal.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("re-marshal decoded JSON: %v", err))
	}
	return b
}
