// Command mkimage builds a scratch-style container image from local files
// (static binaries, typically) and writes it as a docker-archive tarball,
// which both `docker load` and `ctr images import` read. No base image and
// no registry are involved, so it works offline (see internal/ociimage).
//
//	mkimage -o out.tar -tag example.test/app:1 [-entrypoint /app] [-cmd ARG]...
//	        [-env K=V]... [-workdir DIR] [-user UID[:GID]] [-dir PATH]...
//	        SRC[=DEST[:MODE]]...
//
// Each SRC file lands at DEST (default: /basename of SRC) with MODE (octal;
// default: the source file's permission bits). Parent directories are made
// as needed. The image is reproducible: every timestamp is the Unix epoch
// and every file is owned by root.
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
	var cmd, env, dirs multi
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
	return ociimage.Write(*out, s)
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
