package kcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/ociimage"
)

// The image tarballs the cluster builds live here; there is no registry.
func (c *Cluster) imageTar(tag string) string {
	r := strings.NewReplacer("/", "_", ":", "_")
	return filepath.Join(c.Dir, "images", r.Replace(tag)+".tar")
}

// BuildStatic builds a main package of this repository (e.g. ./tools/standin)
// as a static binary (CGO_ENABLED=0, for scratch images) into the
// cluster's directory and returns its path.
func (c *Cluster) BuildStatic(pkg string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building %s needs the go command on PATH: %w", pkg, err)
	}
	out := filepath.Join(c.Dir, "images", "bin", filepath.Base(pkg))
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = c.repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if err := runOut(cmd); err != nil {
		return "", err
	}
	return out, nil
}

// buildImage makes a one-binary image of ./tools/<tool> at /<tool>.
func (c *Cluster) buildImage(tag, tool, entrypoint string) error {
	bin, err := c.BuildStatic("./tools/" + tool)
	if err != nil {
		return err
	}
	return ociimage.Write(c.imageTar(tag), ociimage.Spec{
		Tag:        tag,
		Entrypoint: []string{entrypoint},
		Files:      []ociimage.File{{Src: bin, Dest: entrypoint, Mode: 0o755}},
		Dirs:       []string{"/tmp"},
	})
}

// importImage loads a docker-archive or OCI tarball into containerd's
// k8s.io namespace (the CRI's), unpacked for the snapshotter the CRI uses.
// --local: ctr's default path, containerd's transfer service, unpacks only
// for the platforms and snapshotters of its unpack_config, which names
// overlayfs, not the native snapshotter the cluster uses.
func (c *Cluster) importImage(ctx context.Context, tarball string) error {
	cmd := exec.CommandContext(ctx, c.bin("ctr"), "--address", c.ContainerdSocket, "--namespace", "k8s.io",
		"images", "import", "--local", "--snapshotter", "native", tarball)
	return runOut(cmd)
}

// ImportImage loads an image tarball (docker-archive or OCI, e.g. made by
// tools/mkimage) into the node's containerd. Pods use it by its tag with
// imagePullPolicy IfNotPresent or Never.
func (c *Cluster) ImportImage(t testing.TB, tarball string) {
	t.Helper()
	if err := c.importImage(t.Context(), tarball); err != nil {
		t.Fatal(err)
	}
}

// BuildImage builds an image from spec and imports it; it returns the tag.
func (c *Cluster) BuildImage(t testing.TB, spec ociimage.Spec) string {
	t.Helper()
	c.imgMu.Lock()
	defer c.imgMu.Unlock()
	tar := c.imageTar(spec.Tag)
	if err := os.MkdirAll(filepath.Dir(tar), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Write(tar, spec); err != nil {
		t.Fatalf("build image %s: %v", spec.Tag, err)
	}
	c.ImportImage(t, tar)
	c.images[spec.Tag] = true
	return spec.Tag
}

// Standin returns StandinImage, building and importing it on first use: a
// scratch image whose entrypoint is the static /standin (tools/standin),
// so a pod can run `standin app` (a TCP server naming itself) or
// `standin proxy`.
func (c *Cluster) Standin(t testing.TB) string {
	t.Helper()
	c.imgMu.Lock()
	done := c.images[StandinImage]
	c.imgMu.Unlock()
	if done {
		return StandinImage
	}
	bin, err := c.BuildStatic("./tools/standin")
	if err != nil {
		t.Fatal(err)
	}
	return c.BuildImage(t, ociimage.Spec{
		Tag:        StandinImage,
		Entrypoint: []string{"/standin"},
		Files:      []ociimage.File{{Src: bin, Dest: "/standin", Mode: 0o755}},
		Dirs:       []string{"/tmp"},
	})
}

func (c *Cluster) imagesDir() error {
	if err := os.MkdirAll(filepath.Join(c.Dir, "images", "bin"), 0o755); err != nil {
		return fmt.Errorf("images dir: %w", err)
	}
	return nil
}
