package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"checkout", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-12-01T12:00:00Z"}, {Key: "vcs.modified", Value: "true"},
		}}, "(devel) (rev 0123456789abcdef, 2026-12-01T12:00:00Z, modified) go1.26.8"},
		{"clean checkout", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"},
		}}, "(devel) (rev abc) go1.26.8"},
		{"go install at a tag", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}}, "v0.3.0 go1.26.8"},
		{"no module version", debug.BuildInfo{GoVersion: "go1.26.8"}, "unknown go1.26.8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(&tc.bi).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLinkedStampIsAFallback(t *testing.T) {
	stamped := Info{Module: "(devel)", Revision: "toolchain", Go: "go1.26.8"}
	if got := stamped.orLinked("linker", "2026-12-01T12:00:00Z", "true"); got != stamped {
		t.Errorf("the toolchain's stamp was replaced: %+v", got)
	}
	bare := Info{Module: "(devel)", Go: "go1.26.8"}
	want := "(devel) (rev linker, 2026-12-01T12:00:00Z, modified) go1.26.8"
	if got := bare.orLinked("linker", "2026-12-01T12:00:00Z", "true").String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := bare.orLinked("", "", ""); got != bare {
		t.Errorf("an empty stamp changed the info: %+v", got)
	}
}

func TestReleaseStampNamesTheBuild(t *testing.T) {
	devel := Info{Module: "(devel)", Revision: "abc", Go: "go1.26.8"}
	if got, want := devel.released("v0.3.0").String(), "v0.3.0 (rev abc) go1.26.8"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := devel.released(""); got != devel {
		t.Errorf("no release stamp changed the info: %+v", got)
	}
}
