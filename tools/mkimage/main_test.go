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
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
