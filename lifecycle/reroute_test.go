package lifecycle

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestValidateRerouteInterfaces: the names are checked as the kernel and
// the ruleset need them, each bad one named; good ones are kept sorted and
// deduplicated, and come back in the record's options.
func TestValidateRerouteInterfaces(t *testing.T) {
	bad := []struct{ name, want string }{
		{"", "name is empty"},
		{"sixteen-bytes-00", "at most 15"},
		{"veth*", `contains '*'`},
		{"lo", "cannot be rerouted"},
	}
	for _, b := range bad {
		r := validAdd()
		r.Options.RerouteVirtualInterfaces = []string{"tap0", b.name}
		_, err := validateAdd(r, nft.DefaultSpec("x"))
		if err == nil || !strings.Contains(err.Error(), "options.reroute_virtual_interfaces") || !strings.Contains(err.Error(), b.want) {
			t.Errorf("interface %q: error %v; want one naming the field and saying %q", b.name, err, b.want)
		}
		if Classify(err).Kind != KindInvalid {
			t.Errorf("interface %q: kind %v; want invalid", b.name, Classify(err).Kind)
		}
	}
	r := validAdd()
	for i := range nft.MaxRerouteInterfaces + 1 {
		r.Options.RerouteVirtualInterfaces = append(r.Options.RerouteVirtualInterfaces, fmt.Sprintf("tap%d", i))
	}
	if _, err := validateAdd(r, nft.DefaultSpec("x")); err == nil || !strings.Contains(err.Error(), "at most 16") {
		t.Errorf("17 interfaces: %v", err)
	}

	r = validAdd()
	r.Options.RerouteVirtualInterfaces = []string{"tap0", "k6t-eth0", "tap0"}
	p, err := ValidateAddPod(r, nft.DefaultSpec("x"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.GetOptions().GetRerouteVirtualInterfaces(); !slices.Equal(got, []string{"k6t-eth0", "tap0"}) {
		t.Errorf("recorded interfaces %q; want [k6t-eth0 tap0]", got)
	}
	if got := (&nftredirv1.RedirectOptions{}).GetRerouteVirtualInterfaces(); got != nil {
		t.Errorf("unset is %q", got)
	}
}
