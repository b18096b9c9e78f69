package defaults_test

import (
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
)

func TestCaptureModeNames(t *testing.T) {
	for _, m := range defaults.CaptureModes() {
		for _, s := range []string{m.String(), strings.ToLower(m.String())} {
			if got, err := defaults.ParseCaptureMode(s); err != nil || got != m {
				t.Errorf("ParseCaptureMode(%q) = %s, %v; want %s", s, got, err, m)
			}
		}
	}
	if got := defaults.CaptureModeNames(); got != "TPROXY or REDIRECT" {
		t.Errorf("CaptureModeNames() = %q", got)
	}
	if _, err := defaults.ParseCaptureMode("SIDEWAYS"); err == nil || !strings.Contains(err.Error(), "TPROXY or REDIRECT") {
		t.Errorf("ParseCaptureMode(SIDEWAYS): %v", err)
	}
	var zero defaults.CaptureMode
	if zero != defaults.Mode {
		t.Errorf("the zero mode is %s, the default %s: a spec that names no mode would not get the default", zero, defaults.Mode)
	}
}

func TestCheckPodUID(t *testing.T) {
	for _, ok := range []string{"0b6f3c1e-1d2a-4b8e-9f00-123456789abc", "cni-ctr_1.2", strings.Repeat("a", defaults.MaxPodUIDLen), "ünïcode"} {
		if err := defaults.CheckPodUID(ok); err != nil {
			t.Errorf("CheckPodUID(%q): %v", ok, err)
		}
	}
	for uid, want := range map[string]string{
		"": "is required",
		strings.Repeat("a", defaults.MaxPodUIDLen+1): "at most 128",
		"a\xffb":   "UTF-8",
		"a b":      "without spaces",
		"a/b":      "slashes",
		`a"b`:      "quotes",
		"a'b":      "quotes",
		`a\b`:      "backslashes",
		"a\nb":     "printable",
		"a\u200bb": "printable",
	} {
		err := defaults.CheckPodUID(uid)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckPodUID(%q) = %v; want an error containing %q", uid, err, want)
		}
	}
}

// The probe sources must be addresses no pod or service uses: link-local
// for IPv4, a unique local address for IPv6.
func TestProbeSources(t *testing.T) {
	if a := defaults.ProbeSourceV4(); !a.Is4() || !a.IsLinkLocalUnicast() {
		t.Errorf("ProbeSourceV4 %s is not IPv4 link-local", a)
	}
	if a := defaults.ProbeSourceV6(); !a.Is6() || a.Is4In6() || !a.IsPrivate() {
		t.Errorf("ProbeSourceV6 %s is not an IPv6 unique local address", a)
	}
	if a := defaults.TProxyAddrV4(); !a.Is4() || !a.IsLoopback() {
		t.Errorf("TProxyAddrV4 %s", a)
	}
	if a := defaults.TProxyAddrV6(); !a.Is6() || !a.IsLoopback() {
		t.Errorf("TProxyAddrV6 %s", a)
	}
}
