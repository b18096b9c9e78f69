package defaults

import (
	"fmt"
	"strings"
)

// CaptureMode selects how inbound TCP reaches the proxy. Outbound TCP is
// redirected to OutboundPort in both modes.
type CaptureMode uint8

const (
	// TProxy delivers inbound TCP with nft tproxy to transparent
	// listeners; the accepted socket's local address is the original
	// destination. No NAT. It is the zero value, so a spec that says
	// nothing gets the default.
	TProxy CaptureMode = iota
	// Redirect NATs inbound TCP to InboundPort; the original destination
	// is read with SO_ORIGINAL_DST. It works where TPROXY does not
	// (platforms with src_valid_mark=1), and is what Istio uses since 1.24.
	Redirect
)

// CaptureModes lists every mode, in the order help texts name them.
func CaptureModes() []CaptureMode { return []CaptureMode{TProxy, Redirect} }

// String is the mode's name as the daemon's flags, records and logs
// spell it.
func (m CaptureMode) String() string {
	switch m {
	case TProxy:
		return "TPROXY"
	case Redirect:
		return "REDIRECT"
	}
	return fmt.Sprintf("CaptureMode(%d)", uint8(m))
}

// CaptureModeNames is "TPROXY or REDIRECT", for help texts and errors.
func CaptureModeNames() string {
	modes := CaptureModes()
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.String()
	}
	return strings.Join(names, " or ")
}

// ParseCaptureMode reads a mode name in any case: flags and records say
// TPROXY, Kubernetes annotations and the CLI say tproxy.
func ParseCaptureMode(s string) (CaptureMode, error) {
	for _, m := range CaptureModes() {
		if strings.EqualFold(s, m.String()) {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown capture mode %q (want %s)", s, CaptureModeNames())
}
