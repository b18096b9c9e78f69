// Package version describes the running binary from the build information
// the Go toolchain embeds: the module version, the VCS revision and time,
// whether the tree had local changes, and the Go version.
package version

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Info is what a binary knows about its own build.
type Info struct {
	// Module is the build's version: the release it was stamped as
	// (hack/ldflags.sh, make build VERSION=v0.3.0), else the main
	// module's version: "(devel)" for a build from a checkout, a tag such
	// as "v0.3.0" for `go install ...@v0.3.0`.
	Module string
	// Revision and Time are the VCS commit and its time; empty when the
	// build had no VCS information (-buildvcs=false, or no checkout).
	Revision string
	Time     string
	// Modified: the checkout had uncommitted changes.
	Modified bool
	Go       string
}

// The VCS stamp given by the linker (hack/ldflags.sh, which make build,
// the image and the tests use), for builds where the Go toolchain stamps none:
// it finds a repository only by a .git directory, so a build in a linked
// git worktree (whose .git is a file) carries no vcs.* settings.
var (
	revision     string
	revisionTime string
	modified     string
)

// release is the version a build from a checkout was stamped as by the
// linker (hack/ldflags.sh, from make's VERSION): the toolchain records a
// module version only for `go install ...@version`, so without it every
// image built from a checkout would call itself "(devel)" and two
// releases could not be told apart by --version or build_info.
var release string

// Get reads the running binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{GoVersion: runtime.Version()}
	}
	return fromBuildInfo(bi).orLinked(revision, revisionTime, modified).released(release)
}

// released names the build by its release stamp, when it has one.
func (in Info) released(version string) Info {
	if version != "" {
		in.Module = version
	}
	return in
}

// orLinked fills the VCS fields from the linker's stamp when the build
// information has none; the toolchain's own stamp wins.
func (in Info) orLinked(rev, tm, mod string) Info {
	if in.Revision != "" || rev == "" {
		return in
	}
	in.Revision, in.Time, in.Modified = rev, tm, mod == "true"
	return in
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Module: bi.Main.Version, Go: bi.GoVersion}
	if in.Module == "" {
		in.Module = "unknown"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is one line: "v0.3.0 (rev 1a2b3c4…, 2026-12-01T12:00:00Z, modified) go1.26.8".
func (in Info) String() string {
	s := in.Module
	if in.Revision != "" {
		s += " (rev " + in.Revision
		if in.Time != "" {
			s += ", " + in.Time
		}
		if in.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + " " + in.Go
}

// Print writes "name version-line" and a newline, the output of every
// binary's --version.
func Print(w io.Writer, name string) {
	fmt.Fprintf(w, "%s %s\n", name, Get())
}
