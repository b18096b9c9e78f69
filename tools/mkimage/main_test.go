package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImage builds an image and reads it back the way a loader does: the
// tag, the config and every file with its mode.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "conf")
	if err := os.WriteFile(conf, []byte("k=v\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	err := run([]string{"-o", out, "-tag", "example.test/app:1", "-entrypoint", "/app",
		"-cmd", "serve", "-cmd", "-port=1", "-env", "A=b", "-dir", "/tmp",
		bin, conf + "=/etc/app/conf:0644"})
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("example.test/app:1")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || !slices.Equal(cf.Config.Entrypoint, []string{"/app"}) ||
		!slices.Equal(cf.Config.Cmd, []string{"serve", "-port=1"}) || !slices.Equal(cf.Config.Env, []string{"A=b"}) {
		t.Errorf("config: os %q entrypoint %q cmd %q env %q", cf.OS, cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type entry struct {
		mode int64
		body string
	}
	got := map[string]entry{}
	var order []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		io.Copy(&b, tr)
		got[h.Name] = entry{h.Mode, b.String()}
		order = append(order, h.Name)
	}
	want := map[string]entry{
		"tmp/":         {0o1777, ""},
		"app":          {0o755, "#!binary"},
		"etc/":         {0o755, ""},
		"etc/app/":     {0o755, ""},
		"etc/app/conf": {0o644, "k=v\n"},
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: got %+v (present %v), want %+v", k, g, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("layer has %v; want exactly %d entries", order, len(want))
	}
	if slices.Index(order, "etc/") > slices.Index(order, "etc/app/conf") {
		t.Errorf("parent after child: %v", order)
	}
}

func TestBadArguments(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	os.WriteFile(f, nil, 0o644)
	out := filepath.Join(dir, "o.tar")
	for _, args := range [][]string{
		{"-tag", "a.test/x:1", f},                                  // no -o
		{"-o", out, f},                                             // no -tag
		{"-o", out, "-tag", "a.test/x:1"},                          // no files
		{"-o", out, "-tag", "a.test/x:1", f + "=rel"},              // relative dest
		{"-o", out, "-tag", "a.test/x:1", f + "=/f:9"},             // not octal
		{"-o", out, "-tag", "a.test/x:1", f, f},                    // twice
		{"-o", out, "-tag", "a.test/x:1", dir},                     // a directory
		{"-o", out, "-tag", "a.test/x:1", "-env", "NOEQ", f},       // bad env
		{"-o", out, "-tag", "Bad Tag", f},                          // bad tag
		{"-o", out, "-tag", "a.test/x:1", "-dir", "/f", f + "=/f"}, // dir and file
	} {
		if err := run(args); err == nil {
			t.Errorf("mkimage %q: no error", args)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("mkimage %q: wrote %s despite the error", args, out)
			os.Remove(out)
		}
	}
}

// TestIndex builds an image for two platforms, each from its own dir, and
// reads the OCI layout back as an importer does: index.json names one
// image index, which holds one image per platform with that platform's
// files.
func TestIndex(t *testing.T) {
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		d := filepath.Join(dir, arch)
		os.MkdirAll(d, 0o755)
		if err := os.WriteFile(filepath.Join(d, "app"), []byte("binary for "+arch), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "img.tar")
	if err := run([]string{"-o", out, "-tag", "example.test/app:1", "-entrypoint", "/app", "-dir", "/tmp",
		"-platform", "linux/amd64=" + filepath.Join(dir, "amd64"), "-platform", "linux/arm64=" + filepath.Join(dir, "arm64"),
		"app=/app:0755"}); err != nil {
		t.Fatal(err)
	}
	lp := untar(t, out)
	top, err := layout.ImageIndexFromPath(lp)
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index.json: %+v, %v; want one entry", im, err)
	}
	d := im.Manifests[0]
	if d.MediaType != types.OCIImageIndex || d.Annotations["io.containerd.image.name"] != "example.test/app:1" ||
		d.Annotations["org.opencontainers.image.ref.name"] != "1" {
		t.Errorf("index.json entry %+v", d)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 2 {
		t.Fatalf("image index %+v, %v; want two images", m, err)
	}
	for _, md := range m.Manifests {
		if md.Platform == nil || md.Platform.OS != "linux" || md.MediaType != types.OCIManifestSchema1 {
			t.Fatalf("manifest %+v", md)
		}
		arch := md.Platform.Architecture
		img, err := idx.Image(md.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil || cf.Architecture != arch || cf.OS != "linux" || !slices.Equal(cf.Config.Entrypoint, []string{"/app"}) {
			t.Errorf("%s: config %+v, %v", arch, cf, err)
		}
		layers, _ := img.Layers()
		if len(layers) != 1 {
			t.Fatalf("%s: %d layers", arch, len(layers))
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		found := false
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Name == "app" {
				b, _ := io.ReadAll(tr)
				found = string(b) == "binary for "+arch && h.Mode == 0o755
			}
		}
		rc.Close()
		if !found {
			t.Errorf("%s: the layer lacks its own /app", arch)
		}
	}
	// The same inputs make the same bytes.
	again := filepath.Join(dir, "again.tar")
	run([]string{"-o", again, "-tag", "example.test/app:1", "-entrypoint", "/app", "-dir", "/tmp",
		"-platform", "linux/amd64=" + filepath.Join(dir, "amd64"), "-platform", "linux/arm64=" + filepath.Join(dir, "arm64"),
		"app=/app:0755"})
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same files differ")
	}
	for _, bad := range [][]string{
		{"-platform", "amd64=" + dir},
		{"-platform", "linux/amd64"},
		{"-platform", "windows/amd64=" + dir},
		{"-platform", "linux/amd64=" + filepath.Join(dir, "amd64"), "-platform", "linux/amd64=" + filepath.Join(dir, "arm64")},
		{"-platform", "linux/arm64=" + filepath.Join(dir, "missing")},
	} {
		o := filepath.Join(dir, "bad.tar")
		if err := run(append([]string{"-o", o, "-tag", "example.test/app:1"}, append(bad, "app=/app")...)); err == nil {
			t.Errorf("mkimage %q: no error", bad)
		}
		if _, err := os.Stat(o); err == nil {
			t.Errorf("mkimage %q wrote %s despite the error", bad, o)
		}
	}
}

// untar unpacks an OCI layout tarball into a temporary dir.
func untar(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, _ := io.ReadAll(tr)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
