package main

import (
	"io"
	"slices"
	"testing"

	"github.com/nftredir/nftredir/internal/defaults"
)

func TestFlagNetnsDirs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{nil, nil, defaults.NetnsDirs()},
		// Given, the list replaces the default rather than adding to it.
		{[]string{"--netns-dirs", "/run/netns"}, nil, []string{"/run/netns"}},
		{[]string{"--netns-dirs", "/a,/b"}, nil, []string{"/a", "/b"}},
		// Empty turns discovery off.
		{[]string{"--netns-dirs="}, nil, nil},
		{nil, map[string]string{"NFTREDIR_NETNS_DIRS": "/x"}, []string{"/x"}},
	} {
		o, err := parseFlags(tc.args, env(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%q %v: %v", tc.args, tc.env, err)
		}
		if !slices.Equal(o.netnsDirs, tc.want) {
			t.Errorf("%q %v: netns dirs %q, want %q", tc.args, tc.env, o.netnsDirs, tc.want)
		}
	}
	if _, err := parseFlags([]string{"--netns-dirs", "relative"}, env(nil), io.Discard); err == nil {
		t.Error("a relative --netns-dirs was accepted")
	}
}
