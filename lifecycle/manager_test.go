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
		{"routing mark differs from tproxy mark", func(c *Config) {
			c.Routing = netns.Routing{Mark: 0x222, Mask: 0xfff, Table: 100, Priority: 32764}
		}, "differs from the tproxy mark"},
		{"bad routing", func(c *Config) { c.Routing = netns.Routing{Mark: 0x111, Mask: 0xfff, Table: 254, Priority: 1} }, "reserved"},
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
