package apimode_test

import (
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Every mode has an API value and back, and every API value but
// UNSPECIFIED is a mode: the two vocabularies cannot drift apart.
func TestModesMatchTheAPI(t *testing.T) {
	for _, m := range defaults.CaptureModes() {
		c := apimode.ToAPI(m)
		if c == nftredirv1.CaptureMode_CAPTURE_MODE_UNSPECIFIED {
			t.Errorf("mode %s has no API value", m)
			continue
		}
		back, set, err := apimode.FromAPI(c)
		if err != nil || !set || back != m {
			t.Errorf("FromAPI(%s) = %s, %v, %v; want %s", c, back, set, err, m)
		}
		if p, err := apimode.Parse(strings.ToLower(m.String())); err != nil || p != c {
			t.Errorf("Parse(%q) = %s, %v; want %s", strings.ToLower(m.String()), p, err, c)
		}
	}
	for v := range nftredirv1.CaptureMode_name {
		c := nftredirv1.CaptureMode(v)
		if _, set, err := apimode.FromAPI(c); c != nftredirv1.CaptureMode_CAPTURE_MODE_UNSPECIFIED && (err != nil || !set) {
			t.Errorf("API value %s is no mode: %v", c, err)
		}
	}
	if m, set, err := apimode.FromAPI(nftredirv1.CaptureMode_CAPTURE_MODE_UNSPECIFIED); err != nil || set || m != defaults.Mode {
		t.Errorf("FromAPI(UNSPECIFIED) = %s, %v, %v; want the default, unset", m, set, err)
	}
	_, _, err := apimode.FromAPI(99)
	if err == nil || !strings.Contains(err.Error(), "CAPTURE_MODE_TPROXY or CAPTURE_MODE_REDIRECT") {
		t.Errorf("FromAPI(99): %v", err)
	}
	if _, err := apimode.Parse("sideways"); err == nil {
		t.Error(`Parse("sideways") succeeded`)
	}
}
