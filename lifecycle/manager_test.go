package lifecycle

import (
	"strings"
	"testing"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/state"
)

func TestNewRejectsBadConfig(t *testing.T) {
	store, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	base := func() Config {
		return Config{Engine: capturetest.NewFake(), Store: store}
	}
	badDefaults := nft.DefaultSpec("")
	badDefaults.InboundPort = badDefaults.OutboundPort
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no engine", func(c *Config) { c.Engine = nil }, "Engine"},
		{"no store", func(c *Config) { c.Store = nil }, "Store"},
		{"ack without zds", func(c *Config) { c.ZDSRequireAck = true }, "ZDSRequireAck"},
		{"bad route table", func(c *Config) { c.RouteTable = 254 }, "reserved"},
		{"bad rule priority", func(c *Config) { c.RulePriority = 32766 }, "priority"},
		{"bad defaults", func(c *Config) { c.Defaults = &badDefaults }, "defaults"},
	}
	for _, tt := range tests {
		cfg := base()
		tt.edit(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error about %q", tt.name, err, tt.want)
		}
	}
	if _, err := New(base()); err != nil {
		t.Errorf("good config: %v", err)
	}
}

// The fwmark rule matches the spec's tproxy mark: there is no second copy
// of the mark that could differ from it.
func TestRoutingFollowsTheTProxyMark(t *testing.T) {
	store, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	engine := capturetest.NewFake()
	spec := nft.DefaultSpec("")
	spec.TProxyMark = nft.Mark{Value: 0x2220, Mask: 0xfff0}
	s, err := New(Config{Engine: engine, Store: store, Defaults: &spec, RouteTable: 7, RulePriority: 99})
	if err != nil {
		t.Fatal(err)
	}
	want := netns.Routing{Mark: 0x2220, Mask: 0xfff0, Table: 7, Priority: 99}
	if s.routing != want {
		t.Errorf("routing %+v, want %+v", s.routing, want)
	}
	if s, err = New(Config{Engine: engine, Store: store}); err != nil {
		t.Fatal(err)
	}
	if s.routing != netns.DefaultRouting() {
		t.Errorf("default routing %+v, want %+v", s.routing, netns.DefaultRouting())
	}
}
