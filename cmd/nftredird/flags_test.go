package main

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/nft"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFlagDefaults(t *testing.T) {
	o, err := parseFlags(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := nft.DefaultSpec("flags")
	if !equalSpec(o.spec, want) {
		t.Errorf("default spec %+v, want %+v", o.spec, want)
	}
	if o.socket != "/run/nftredir/nftredir.sock" || o.stateDir != "/run/nftredir/pods" || o.reconcileInterval != 30*time.Second || !o.reflection {
		t.Errorf("defaults: %+v", o)
	}
	if o.routing.Table != 100 || o.routing.Priority != 32764 || o.routing.Mark != 0x111 || o.routing.Mask != 0xfff {
		t.Errorf("routing: %+v", o.routing)
	}
}

func equalSpec(a, b nft.Spec) bool {
	return a.Mode == b.Mode && a.OutboundPort == b.OutboundPort && a.InboundPort == b.InboundPort &&
		a.InboundHBONEPort == b.InboundHBONEPort && a.DNSPort == b.DNSPort && a.ProxyMark == b.ProxyMark &&
		a.TProxyMark == b.TProxyMark && a.ProbeSourceV4 == b.ProbeSourceV4 && a.ProbeSourceV6 == b.ProbeSourceV6 &&
		a.CaptureDNS == b.CaptureDNS && a.IPv6 == b.IPv6
}

func TestFlagWinsOverEnv(t *testing.T) {
	e := env(map[string]string{
		"NFTREDIR_LOG_LEVEL":       "debug",
		"NFTREDIR_ALLOW_UID":       "1000,1001",
		"NFTREDIR_OUTBOUND_PORT":   "16001",
		"NFTREDIR_CAPTURE_MODE":    "REDIRECT",
		"NFTREDIR_PROBE_SOURCE_V6": "", // set but empty: disables
	})
	o, err := parseFlags([]string{"--outbound-port", "17001", "--allow-uid=42"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.logLevel != "debug" || o.spec.Mode != nft.ModeRedirect {
		t.Errorf("env twins not applied: level %q mode %v", o.logLevel, o.spec.Mode)
	}
	if o.spec.OutboundPort != 17001 || !slices.Equal(o.allowUIDs, idList{42}) {
		t.Errorf("flags must win: port %d uids %v", o.spec.OutboundPort, o.allowUIDs)
	}
	if o.spec.ProbeSourceV6.IsValid() {
		t.Error("an empty NFTREDIR_PROBE_SOURCE_V6 must disable the v6 probe bypass")
	}
}

func TestInvalidFlags(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--capture-mode", "NAT"}, nil, "capture mode"},
		{[]string{"--outbound-port", "0"}, nil, "not a port"},
		{[]string{"--inbound-port", "15001"}, nil, "both 15001"},
		{[]string{"--proxy-mark", "0x111/0xfff"}, nil, "indistinguishable"},
		{[]string{"--proxy-mark", "zz"}, nil, "mark/mask"},
		{[]string{"--route-table", "254"}, nil, "reserved"},
		{[]string{"--rule-priority", "40000"}, nil, "priority"},
		{[]string{"--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"--socket", "rel.sock"}, nil, "--socket"},
		{[]string{"--state-dir", "/a/../b"}, nil, "--state-dir"},
		{[]string{"--reconcile-interval", "0s"}, nil, "--reconcile-interval"},
		{[]string{"--allow-uid", "root"}, nil, "numeric"},
		{[]string{"--protect-netns", "relative/path"}, nil, "absolute"},
		{[]string{"--probe-source-v4", "fd00::1"}, nil, "IPv4"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{nil, map[string]string{"NFTREDIR_HBONE_PORT": "x"}, "NFTREDIR_HBONE_PORT"},
	}
	for _, tt := range tests {
		_, err := parseFlags(tt.args, env(tt.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v %v: error %v, want it to mention %q", tt.args, tt.env, err, tt.want)
		}
	}
}

func TestHelpDocumentsEnvTwins(t *testing.T) {
	var out strings.Builder
	_, err := parseFlags([]string{"--help"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"NFTREDIR_SOCKET", "NFTREDIR_ALLOW_GID", "--tproxy-mark", "default 0x111/0xfff", "wins over"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	if code := run([]string{"--bogus"}, env(nil), io.Discard); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
	if code := run([]string{"-h"}, env(nil), io.Discard); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}
