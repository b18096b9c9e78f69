package rpc

import (
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Every mode of the vocabulary has the API's value of the same name, so a
// mode added there cannot reach the daemon as "unspecified".
func TestCaptureModeOfEveryMode(t *testing.T) {
	for _, m := range defaults.CaptureModes() {
		got := CaptureModeOf(m)
		want := nftredirv1.CaptureMode_value["CAPTURE_MODE_"+m.String()]
		if got == CaptureModeUnspecified || int32(got) != want {
			t.Errorf("CaptureModeOf(%s) = %d, want %d", m, got, want)
		}
	}
}
