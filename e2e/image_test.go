package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// imageTag is make image's default tag, the chart's default image.
const imageTag = "nftredir:dev"

// imagePlatforms are make image's: one image each under the index.
var imagePlatforms = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// builtImage is hack/image.sh's output: the tarball and the binaries of
// each platform it put in the image.
type builtImage struct {
	tarball string
	binRoot string // binRoot/linux-<arch>/<binary>
}

var (
	imageOnce sync.Once
	imageDir  string
	imageErr  error
	imageOut  string
)

// buildImage runs hack/image.sh, make image's builder, once per test
// binary: it cross-compiles the binaries for every platform and writes
// the index, under binDir (TestMain removes it).
func buildImage(t *testing.T) (builtImage, Binaries) {
	t.Helper()
	bin := binaries(t)
	imageOnce.Do(func() {
		imageDir = filepath.Join(binDir, "image")
		start := time.Now()
		out := filepath.Join(imageDir, "nftredir-image.tar")
		cmd := exec.Command(filepath.Join(bin.Repo, "hack", "image.sh"), out, imageTag, filepath.Join(imageDir, "bin"))
		cmd.Dir = bin.Repo
		b, err := cmd.CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("hack/image.sh: %v\n%s", err, b)
			return
		}
		imageOut = fmt.Sprintf("%s (%s)", bytes.TrimSpace(b), time.Since(start).Round(time.Millisecond))
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	t.Logf("%s", imageOut)
	return builtImage{tarball: filepath.Join(imageDir, "nftredir-image.tar"), binRoot: filepath.Join(imageDir, "bin")}, bin
}

// untarLayout unpacks an OCI image layout tarball.
func untarLayout(t *testing.T, path string) string {
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
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("tar entry %q leaves the layout", h.Name)
		}
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestImage reads the tarball as ctr import and docker load do: an OCI
// layout whose index.json names one image index, tagged nftredir:dev,
// holding one image per platform (linux/amd64 and linux/arm64), each a
// single layer with the three static binaries of its architecture, byte
// for byte the ones hack/image.sh built, root-owned, with nftredird as
// the entrypoint.
func TestImage(t *testing.T) {
	img, _ := buildImage(t)
	top, err := layout.ImageIndexFromPath(untarLayout(t, img.tarball))
	if err != nil {
		t.Fatalf("OCI layout: %v", err)
	}
	im, err := top.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index.json %+v (%v); want one entry", im, err)
	}
	if d := im.Manifests[0]; d.MediaType != types.OCIImageIndex || d.Annotations["io.containerd.image.name"] != "docker.io/library/"+imageTag ||
		d.Annotations["org.opencontainers.image.ref.name"] != "dev" {
		t.Fatalf("index.json entry %+v; want an image index named docker.io/library/%s (what the kubelet resolves %q to)", d, imageTag, imageTag)
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, md := range m.Manifests {
		if md.Platform == nil || md.Platform.OS != "linux" {
			t.Errorf("manifest %s: platform %+v", md.Digest, md.Platform)
			continue
		}
		arch := md.Platform.Architecture
		machine, ok := imagePlatforms[arch]
		if !ok || seen[arch] {
			t.Errorf("unexpected or repeated platform linux/%s", arch)
			continue
		}
		seen[arch] = true
		image, err := idx.Image(md.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkPlatformImage(t, image, arch, machine, filepath.Join(img.binRoot, "linux-"+arch))
	}
	for arch := range imagePlatforms {
		if !seen[arch] {
			t.Errorf("the index has no linux/%s image", arch)
		}
	}
	if fi, err := os.Stat(img.tarball); err == nil {
		t.Logf("image tarball: %d KiB, platforms %v", fi.Size()/1024, slices.Sorted(maps.Keys(seen)))
	}
}

func checkPlatformImage(t *testing.T, img v1.Image, arch string, machine elf.Machine, binDir string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if ep := cf.Config.Entrypoint; len(ep) != 1 || ep[0] != "/usr/local/bin/nftredird" {
		t.Errorf("%s: entrypoint %q; want /usr/local/bin/nftredird", arch, ep)
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("%s: config platform %s/%s", arch, cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s: %d layers (%v); want 1", arch, len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want := map[string]string{
		"usr/local/bin/nftredird":           filepath.Join(binDir, "nftredird"),
		"usr/local/bin/nftredirctl":         filepath.Join(binDir, "nftredirctl"),
		"usr/local/bin/nftredir-cni":        filepath.Join(binDir, "nftredir-cni"),
		"usr/local/bin/nftredir-cni-helper": filepath.Join(binDir, "nftredir-cni-helper"),
	}
	seen := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(h.Name, "/")
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s owned by %d:%d; want root", arch, name, h.Uid, h.Gid)
		}
		src, ok := want[name]
		if !ok {
			continue
		}
		seen[name] = true
		if h.Typeflag != tar.TypeReg || h.Mode&0o777 != 0o755 {
			t.Errorf("%s: %s: type %c mode %#o; want a 0755 file", arch, name, h.Typeflag, h.Mode)
		}
		got, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		orig, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(orig) {
			t.Errorf("%s: %s differs from %s", arch, name, src)
		}
		f, err := elf.NewFile(bytes.NewReader(got))
		if err != nil {
			t.Fatalf("%s: %s: %v", arch, name, err)
		}
		if f.Machine != machine {
			t.Errorf("%s: %s is built for %v; want %v", arch, name, f.Machine, machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s: %s is dynamically linked: a scratch image has no loader", arch, name)
			}
		}
	}
	for n := range want {
		if !seen[n] {
			t.Errorf("%s: the layer has no %s", arch, n)
		}
	}
}

// containerdTools finds containerd, ctr and runc: on PATH, or in the
// cache hack/k8s-tools.sh fills for the cluster's Kubernetes version.
func containerdTools() (dir string, ok bool) {
	if p, err := exec.LookPath("containerd"); err == nil {
		d := filepath.Dir(p)
		if _, err := exec.LookPath("ctr"); err == nil {
			return d, true
		}
	}
	d := kcluster.ToolsDir()
	for _, b := range []string{"containerd", "ctr", "runc"} {
		if _, err := os.Stat(filepath.Join(d, b)); err != nil {
			return "", false
		}
	}
	return d, true
}

// TestImageImportAndRun imports the image into a containerd of the test's
// own (its root, state and socket in a temp dir, no CRI) with `ctr -n
// k8s.io images import`, as a node operator would, and runs nftredirctl
// --version in a container of it: the static binaries run from scratch.
func TestImageImportAndRun(t *testing.T) {
	nstest.RequirePrivileged(t)
	tools, ok := containerdTools()
	if !ok {
		t.Skip("no containerd and ctr here (hack/k8s-tools.sh caches them)")
	}
	img, _ := buildImage(t)
	dir, err := os.MkdirTemp("/run", "nftredir-e2e-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A failed run may leave the container's overlay mount under
		// state.
		exec.Command("umount", "-R", filepath.Join(dir, "state")).Run()
		os.RemoveAll(dir)
	})
	sock := filepath.Join(dir, "containerd.sock")
	// No CRI and no NRI: NRI would listen on the machine's
	// /var/run/nri/nri.sock.
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.snapshotter.v1.zfs", "io.containerd.internal.v1.tracing", "io.containerd.image-verifier.v1.bindir"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(cleanEnv(), "PATH="+tools+":"+os.Getenv("PATH"))
	var logBuf bytes.Buffer
	cd := exec.Command(filepath.Join(tools, "containerd"), "--config", cfgPath)
	cd.Env = env
	cd.Stdout, cd.Stderr = &logBuf, &logBuf
	cd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("containerd log:\n%s", logBuf.String())
		}
	})
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, filepath.Join(tools, "ctr"), append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
		c.Env = env
		// Apart: on cgroup v1 every ctr command warns on stderr that
		// containerd deprecates it, which would precede the container's
		// output.
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		if err := c.Run(); err != nil {
			return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return stdout.String(), nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := ctr("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd did not come up")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The node's default path: containerd's transfer service unpacks for
	// the default snapshotter (overlayfs) and the node's platform.
	if out, err := ctr("images", "import", img.tarball); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	ref := "docker.io/library/" + imageTag
	out, err := ctr("images", "ls", "-q")
	if err != nil || !strings.Contains(out, ref) {
		t.Fatalf("ctr images ls: %v\n%s\nwant %s (what kubelet resolves %q to)", err, out, ref, imageTag)
	}
	id := "nftredir-e2e-" + strconv.FormatUint(rand.Uint64(), 36)
	out, err = ctr("run", "--rm", ref, id, "/usr/local/bin/nftredirctl", "--version")
	if err != nil || !strings.HasPrefix(out, "nftredirctl ") {
		t.Fatalf("ctr run nftredirctl --version: %v\n%s", err, out)
	}
	t.Logf("in the container: %s", strings.TrimSpace(out))
}
