// Command mkimage builds a scratch-style container image from local files
// (static binaries, typically) and writes it as a docker-archive tarball,
// which both `docker load` and `ctr images import` read. No base image and
// no registry are involved, so it works offline.
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
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	files, err := parseFiles(fs.Args())
	if err != nil {
		return err
	}
	for _, e := range env {
		if !strings.Contains(e, "=") {
			return fmt.Errorf("-env %q: want K=V", e)
		}
	}
	layerTar, err := buildLayer(files, dirs)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", *arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Env = env
	if *entrypoint != "" {
		cf.Config.Entrypoint = []string{*entrypoint}
	}
	cf.Config.Cmd = cmd
	cf.Config.WorkingDir = *workdir
	cf.Config.User = *user
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	// Written beside the target and renamed, so a failed run leaves no
	// half tarball that an import would choke on.
	tmp := *out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, *out)
}

type file struct {
	src, dest string
	mode      os.FileMode // 0: the source's
}

func parseFiles(args []string) ([]file, error) {
	if len(args) == 0 {
		return nil, errors.New("no files given")
	}
	var files []file
	seen := map[string]bool{}
	for _, a := range args {
		f := file{src: a}
		if src, dest, ok := strings.Cut(a, "="); ok {
			f.src, f.dest = src, dest
			if d, m, ok := strings.Cut(dest, ":"); ok {
				v, err := strconv.ParseUint(m, 8, 32)
				if err != nil || v > 0o7777 {
					return nil, fmt.Errorf("%s: mode %q is not octal permission bits", a, m)
				}
				f.dest, f.mode = d, os.FileMode(v)
			}
		}
		if f.dest == "" {
			f.dest = "/" + filepath.Base(f.src)
		}
		if !path.IsAbs(f.dest) {
			return nil, fmt.Errorf("%s: destination %q must be absolute", a, f.dest)
		}
		f.dest = path.Clean(f.dest)
		if f.dest == "/" {
			return nil, fmt.Errorf("%s: destination is the root directory", a)
		}
		if seen[f.dest] {
			return nil, fmt.Errorf("%s: %s given twice", a, f.dest)
		}
		seen[f.dest] = true
		files = append(files, f)
	}
	return files, nil
}

// buildLayer returns an uncompressed tar of the files and directories,
// each parent directory before its children, in a stable order.
func buildLayer(files []file, dirs []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	made := map[string]bool{}
	mkdir := func(d string) error {
		var chain []string
		for p := d; p != "/" && p != "." && !made[p]; p = path.Dir(p) {
			chain = append(chain, p)
		}
		slices.Reverse(chain)
		for _, p := range chain {
			made[p] = true
			mode := int64(0o755)
			if p == "/tmp" {
				mode = 0o1777
			}
			if err := tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/",
				Mode: mode, ModTime: epoch, Format: tar.FormatPAX,
			}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range dirs {
		if !path.IsAbs(d) {
			return nil, fmt.Errorf("-dir %q must be absolute", d)
		}
		if err := mkdir(path.Clean(d)); err != nil {
			return nil, err
		}
	}
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b file) int { return strings.Compare(a.dest, b.dest) })
	for _, f := range sorted {
		st, err := os.Stat(f.src)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file", f.src)
		}
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		if made[f.dest] {
			return nil, fmt.Errorf("%s is also a directory", f.dest)
		}
		if err := mkdir(path.Dir(f.dest)); err != nil {
			return nil, err
		}
		mode := f.mode
		if mode == 0 {
			mode = st.Mode().Perm()
		}
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.dest, "/"),
			Mode: int64(mode), Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX,
		}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
