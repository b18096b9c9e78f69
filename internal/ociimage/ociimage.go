// Package ociimage builds scratch-style container images from local files
// (static binaries, typically) and writes them as docker-archive tarballs,
// which both `docker load` and `ctr images import` read. No base image and
// no registry are involved, so it works offline. tools/mkimage is its
// command line; internal/kcluster uses it for the test cluster's images.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Spec is one image: a single layer of Files and Dirs, and its config.
type Spec struct {
	// Tag names the image, e.g. example.test/app:1.
	Tag        string
	Entrypoint []string
	Cmd        []string
	Env        []string // K=V
	WorkingDir string
	User       string
	// Arch defaults to the running program's.
	Arch  string
	Files []File
	// Dirs are empty directories to create (/tmp gets mode 1777).
	Dirs []string
}

// File is one regular file of the image.
type File struct {
	Src  string // on the local filesystem
	Dest string // absolute path in the image
	// Mode is the permission bits in the image; 0 takes the source's.
	Mode os.FileMode
}

// Write builds the image and writes it to out. The image is reproducible:
// every timestamp is the Unix epoch and every file is owned by root. A
// failed write leaves nothing at out.
func Write(out string, s Spec) error {
	ref, err := name.NewTag(s.Tag)
	if err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	if err := s.validate(); err != nil {
		return err
	}
	layerTar, err := buildLayer(s.Files, s.Dirs)
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
	cf.OS, cf.Architecture = "linux", s.Arch
	if cf.Architecture == "" {
		cf.Architecture = runtime.GOARCH
	}
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Env = s.Env
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.WorkingDir = s.WorkingDir
	cf.Config.User = s.User
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	// Written beside the target and renamed, so a failed run leaves no
	// half tarball that an import would choke on.
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

func (s Spec) validate() error {
	if len(s.Files) == 0 {
		return errors.New("no files given")
	}
	for _, e := range s.Env {
		if !strings.Contains(e, "=") {
			return fmt.Errorf("env %q: want K=V", e)
		}
	}
	seen := map[string]bool{}
	for _, f := range s.Files {
		if !path.IsAbs(f.Dest) {
			return fmt.Errorf("%s: destination %q must be absolute", f.Src, f.Dest)
		}
		d := path.Clean(f.Dest)
		if d == "/" {
			return fmt.Errorf("%s: destination is the root directory", f.Src)
		}
		if seen[d] {
			return fmt.Errorf("%s given twice", d)
		}
		seen[d] = true
		if f.Mode&^os.ModePerm&^(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
			return fmt.Errorf("%s: mode %v is not permission bits", f.Src, f.Mode)
		}
	}
	for _, d := range s.Dirs {
		if !path.IsAbs(d) {
			return fmt.Errorf("directory %q must be absolute", d)
		}
	}
	return nil
}

// buildLayer returns an uncompressed tar of the files and directories,
// each parent directory before its children, in a stable order.
func buildLayer(files []File, dirs []string) ([]byte, error) {
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
		if err := mkdir(path.Clean(d)); err != nil {
			return nil, err
		}
	}
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b File) int { return strings.Compare(path.Clean(a.Dest), path.Clean(b.Dest)) })
	for _, f := range sorted {
		dest := path.Clean(f.Dest)
		st, err := os.Stat(f.Src)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file", f.Src)
		}
		if made[dest] {
			return nil, fmt.Errorf("%s is also a directory", dest)
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, err
		}
		if err := mkdir(path.Dir(dest)); err != nil {
			return nil, err
		}
		mode := f.Mode
		if mode == 0 {
			mode = st.Mode().Perm()
		}
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dest, "/"),
			Mode: int64(mode.Perm()) | tarSpecial(mode), Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX,
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

// tarSpecial maps Go's setuid, setgid and sticky bits to tar's.
func tarSpecial(m os.FileMode) int64 {
	var v int64
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}
