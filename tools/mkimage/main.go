// Command mkimage builds a scratch-style container image from local files
// (static binaries, typically) and writes it as a docker-archive tarball,
// or, with -platform, one image per platform under an OCI image index as
// an OCI image layout tarball. `ctr images import` reads both, `docker
// load` too (Docker 25 and later for the index). No base image and no
// registry are involved, so it works offline (see internal/ociimage).
//
//	mkimage -o out.tar -tag example.test/app:1 [-entrypoint /app] [-cmd ARG]...
//	        [-env K=V]... [-workdir DIR] [-user UID[:GID]] [-dir PATH]...
//	        [-arch ARCH | -platform linux/ARCH=DIR...] SRC[=DEST[:MODE]]...
//
// Each SRC file lands at DEST (default: /basename of SRC) with MODE (octal;
// default: the source file's permission bits). Parent directories are made
// as needed. With -platform (repeatable), each platform's image takes its
// files from its DIR: a relative SRC is read under it. The image is
// reproducible: every timestamp is the Unix epoch and every file is owned
// by root.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/nftredir/nftredir/internal/ociimage"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	out := fs.String("o", "", "output tarball (docker-archive)")
	tag := fs.String("tag", "", "image name and tag, e.g. example.test/app:1")
	entrypoint := fs.String("entrypoint", "", "entrypoint (one path; arguments go in -cmd)")
	workdir := fs.String("workdir", "", "working directory")
	user := fs.String("user", "", "user (UID[:GID])")
	arch := fs.String("arch", runtime.GOARCH, "image architecture")
	var cmd, env, dirs, platforms multi
	fs.Var(&platforms, "platform", "linux/`ARCH=DIR`: an image for that platform, its relative SRCs under DIR; with it, the output is an OCI image index (repeatable)")
	fs.Var(&cmd, "cmd", "default argument (repeatable)")
	fs.Var(&env, "env", "environment K=V (repeatable)")
	fs.Var(&dirs, "dir", "empty directory to create, e.g. /tmp (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" {
		return errors.New("-o and -tag are required")
	}
	s := ociimage.Spec{Tag: *tag, Cmd: cmd, Env: env, Dirs: dirs, WorkingDir: *workdir, User: *user, Arch: *arch}
	if *entrypoint != "" {
		s.Entrypoint = []string{*entrypoint}
	}
	for _, a := range fs.Args() {
		f, err := parseFile(a)
		if err != nil {
			return err
		}
		s.Files = append(s.Files, f)
	}
	if len(platforms) == 0 {
		return ociimage.Write(*out, s)
	}
	var specs []ociimage.Spec
	for _, p := range platforms {
		plat, dir, ok := strings.Cut(p, "=")
		arch, found := strings.CutPrefix(plat, "linux/")
		if !ok || !found || arch == "" || strings.Contains(arch, "/") || dir == "" {
			return fmt.Errorf("-platform %q: want linux/ARCH=DIR", p)
		}
		ps := s
		ps.Arch = arch
		ps.Files = nil
		for _, f := range s.Files {
			if !filepath.IsAbs(f.Src) {
				f.Src = filepath.Join(dir, f.Src)
			}
			ps.Files = append(ps.Files, f)
		}
		specs = append(specs, ps)
	}
	return ociimage.WriteIndex(*out, *tag, specs)
}

// parseFile reads SRC[=DEST[:MODE]].
func parseFile(a string) (ociimage.File, error) {
	f := ociimage.File{Src: a}
	if src, dest, ok := strings.Cut(a, "="); ok {
		f.Src, f.Dest = src, dest
		if d, m, ok := strings.Cut(dest, ":"); ok {
			v, err := strconv.ParseUint(m, 8, 32)
			if err != nil || v > 0o7777 {
				return f, fmt.Errorf("%s: mode %q is not octal permission bits", a, m)
			}
			f.Dest, f.Mode = d, os.FileMode(v&0o777)
			for bit, m := range map[uint64]os.FileMode{0o4000: os.ModeSetuid, 0o2000: os.ModeSetgid, 0o1000: os.ModeSticky} {
				if v&bit != 0 {
					f.Mode |= m
				}
			}
		}
	}
	if f.Dest == "" {
		f.Dest = "/" + filepath.Base(f.Src)
	}
	return f, nil
}
