// Package ociimage builds scratch-style container images from local files
// (static binaries, typically): one image as a docker-archive tarball
// (Write), or one image per platform under an OCI image index as an OCI
// image layout tarball (WriteIndex). `ctr images import` reads both and
// `docker load` (Docker 25 and later for the index). No base image and no
// registry are involved, so it works offline. tools/mkimage is its command
// line; internal/testkit/kcluster uses it for the test cluster's images.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
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

// Write builds the image and writes it to out as a docker-archive
// tarball. The image is reproducible: every timestamp is the Unix epoch
// and every file is owned by root. A failed write leaves nothing at out.
func Write(out string, s Spec) error {
	ref, err := name.NewTag(s.Tag)
	if err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	img, err := s.image(types.DockerManifestSchema2, types.DockerConfigJSON, types.DockerLayer)
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

// WriteIndex builds one image per spec, each for its Arch (linux), and
// writes them under one OCI image index, named tag, as an OCI image
// layout tarball: a runtime pulls or imports the index and runs the image
// of its own platform. Each spec's Tag is ignored. Reproducible as Write
// is; a failed write leaves nothing at out.
func WriteIndex(out, tag string, specs []Spec) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	if len(specs) == 0 {
		return errors.New("no platform given")
	}
	var adds []mutate.IndexAddendum
	seen := map[string]bool{}
	for _, s := range specs {
		if s.Arch == "" {
			return errors.New("every platform of an index needs its Arch")
		}
		if seen[s.Arch] {
			return fmt.Errorf("platform linux/%s given twice", s.Arch)
		}
		seen[s.Arch] = true
		img, err := s.image(types.OCIManifestSchema1, types.OCIConfigJSON, types.OCILayer)
		if err != nil {
			return fmt.Errorf("linux/%s: %w", s.Arch, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: s.Arch},
		}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	// index.json lists the image index under the names importers read:
	// containerd's (the full reference, which the kubelet asks for) and
	// the OCI one (the tag).
	top := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: idx, Descriptor: v1.Descriptor{
		Annotations: map[string]string{
			"io.containerd.image.name":          FullName(ref),
			"org.opencontainers.image.ref.name": ref.TagStr(),
		},
	}})
	dir, err := os.MkdirTemp(path.Dir(out), ".ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := layout.Write(dir, top); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarDir(tmp, dir); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

// FullName is the reference as containerd and the kubelet spell it:
// nftredir:dev is docker.io/library/nftredir:dev.
func FullName(ref name.Tag) string {
	reg := ref.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + ref.RepositoryStr() + ":" + ref.TagStr()
}

// tarDir writes the files under dir as a tar at out, in a stable order,
// owned by root, dated the epoch.
func tarDir(out, dir string) error {
	var paths []string
	err := filepathWalk(dir, func(p string) { paths = append(paths, p) })
	if err != nil {
		return err
	}
	slices.Sort(paths)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	epoch := time.Unix(0, 0)
	for _, rel := range paths {
		full := dir + "/" + rel
		st, err := os.Stat(full)
		if err != nil {
			f.Close()
			return err
		}
		h := &tar.Header{Name: rel, ModTime: epoch, Format: tar.FormatPAX, Mode: 0o644, Typeflag: tar.TypeReg, Size: st.Size()}
		if st.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = rel+"/", 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		if !st.IsDir() {
			src, err := os.Open(full)
			if err != nil {
				f.Close()
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				f.Close()
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// image is the spec's image with the given media types (Docker's for a
// docker-archive, OCI's under an OCI index).
func (s Spec) image(manifest, config, layerType types.MediaType) (v1.Image, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	layerTar, err := buildLayer(s.Files, s.Dirs)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(layerType))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, manifest), config)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
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
	return mutate.ConfigFile(img, cf)
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

// filepathWalk calls fn with the slash-separated path, relative to root,
// of everything under root.
func filepathWalk(root string, fn func(rel string)) error {
	return fs.WalkDir(os.DirFS(root), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." {
			fn(p)
		}
		return nil
	})
}
