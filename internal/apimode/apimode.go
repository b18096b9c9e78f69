// Package apimode translates between the capture-mode vocabulary of
// internal/defaults and the API's CaptureMode enum. The two are matched by
// name (TPROXY is CAPTURE_MODE_TPROXY), so a mode added to both needs no
// change here.
package apimode

import (
	"fmt"

	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

const enumPrefix = "CAPTURE_MODE_"

// ToAPI returns the API's enum value for m; CAPTURE_MODE_UNSPECIFIED for
// a mode the API does not know, which a test rules out.
func ToAPI(m defaults.CaptureMode) nftredirv1.CaptureMode {
	return nftredirv1.CaptureMode(nftredirv1.CaptureMode_value[enumPrefix+m.String()])
}

// FromAPI returns the mode an API enum value names. set is false for
// CAPTURE_MODE_UNSPECIFIED (the daemon's default applies); a value this
// build does not know is an error.
func FromAPI(c nftredirv1.CaptureMode) (m defaults.CaptureMode, set bool, err error) {
	if c == nftredirv1.CaptureMode_CAPTURE_MODE_UNSPECIFIED {
		return defaults.Mode, false, nil
	}
	for _, m := range defaults.CaptureModes() {
		if ToAPI(m) == c {
			return m, true, nil
		}
	}
	names := ""
	for i, m := range defaults.CaptureModes() {
		if i > 0 {
			names += " or "
		}
		names += ToAPI(m).String()
	}
	return 0, false, fmt.Errorf("%d is unknown; use %s, or leave it unset", int32(c), names)
}

// Parse reads a mode name in any case ("tproxy", "REDIRECT") as the API's
// enum value.
func Parse(s string) (nftredirv1.CaptureMode, error) {
	m, err := defaults.ParseCaptureMode(s)
	if err != nil {
		return nftredirv1.CaptureMode_CAPTURE_MODE_UNSPECIFIED, err
	}
	return ToAPI(m), nil
}
