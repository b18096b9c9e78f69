package nri

import "testing"

// Which runtime, at which version, can hold a pod back while nftredird
// is away: the table docs/nri.md states.
func TestGateOf(t *testing.T) {
	for _, c := range []struct {
		runtime, version, nri string
		validator, policy     bool
	}{
		{"containerd", "v1.7.27", "v0.8.0", false, false},
		{"containerd", "v2.0.7", "v0.8.0", false, false},
		{"containerd", "v2.1.4", "v0.8.0", false, false},
		{"containerd", "v2.2.0-rc.1", "v0.10.0", false, false},
		{"containerd", "v2.2.0", "v0.10.0", true, false},
		{"containerd", "v2.4.2", "v0.12.3", true, false},
		{"containerd", "2.4.2+unknown", "", true, false},
		{"containerd", "v2.5.0", "v0.12.4", true, true},
		{"containerd", "v3.0.0", "v0.13.0", true, true},
		{"cri-o", "1.33.4", "v0.9.1-0.20250219030224-e597e7849f24", false, false},
		{"cri-o", "1.34.0", "v0.11.0", true, false},
		{"CRI-O", "v1.35.1", "", true, false},
		{"podman", "5.4.0", "v0.12.5", false, true},
		{"containerd", "", "", false, false},
		{"containerd", "main", "unknown", false, false},
	} {
		g := GateOf(c.runtime, c.version, c.nri)
		if g.Validator != c.validator || g.FailurePolicy != c.policy {
			t.Errorf("GateOf(%q, %q, %q) = validator %v, failure policy %v; want %v, %v", c.runtime, c.version, c.nri, g.Validator, g.FailurePolicy, c.validator, c.policy)
		}
		if ok, why := g.FailClosed(); ok != c.validator || ok == (why != "") {
			t.Errorf("GateOf(%q, %q).FailClosed() = %v, %q", c.runtime, c.version, ok, why)
		}
	}
}

func TestParseVersion(t *testing.T) {
	for s, want := range map[string]version{
		"v2.4.2":        {2, 4, 2, false},
		"2.4.2+unknown": {2, 4, 2, false},
		"1.34":          {1, 34, 0, false},
		"v2.2.0-rc.1":   {2, 2, 0, true},
	} {
		if got, ok := parseVersion(s); !ok || got != want {
			t.Errorf("parseVersion(%q) = %v, %v; want %v", s, got, ok, want)
		}
	}
	for _, s := range []string{"", "v2", "main", "2.x.1", "1.2.3.4", "v-1.2"} {
		if v, ok := parseVersion(s); ok {
			t.Errorf("parseVersion(%q) = %v; want no version", s, v)
		}
	}
}
