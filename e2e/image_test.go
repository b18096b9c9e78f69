package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/nftredir/nftredir/internal/nstest"
)

// imageTag is make image's default tag, the one deploy/kubernetes names.
const imageTag = "nftredir:dev"

// buildImage runs hack/image.sh, make image's builder, on the test's
// binaries.
func buildImage(t *testing.T) (string, Binaries) {
	t.Helper()
	bin := binaries(t)
	out := filepath.Join(t.TempDir(), "nftredir-image.tar")
	cmd := exec.Command(filepath.Join(bin.Repo, "hack", "image.sh"), filepath.Dir(bin.Daemon), out, imageTag)
	cmd.Dir = bin.Repo
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/image.sh: %v\n%s", err, b)
	} else {
		t.Logf("%s", bytes.TrimSpace(b))
	}
	return out, bin
}

// TestImage reads the tarball as docker load and ctr import do: one
// tagged image whose single layer holds the three static binaries,
// byte for byte, root-owned, with nftredird as the entrypoint.
func TestImage(t *testing.T) {
	path, bin := buildImage(t)
	mf, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(mf) != 1 || len(mf[0].RepoTags) != 1 || mf[0].RepoTags[0] != imageTag {
		t.Fatalf("manifest %+v; want one image tagged %s", mf, imageTag)
	}
	tag, err := name.NewTag(imageTag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if ep := cf.Config.Entrypoint; len(ep) != 1 || ep[0] != "/usr/local/bin/nftredird" {
		t.Errorf("entrypoint %q; want /usr/local/bin/nftredird", ep)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v); want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want := map[string]string{
		"usr/local/bin/nftredird":    bin.Daemon,
		"usr/local/bin/nftredirctl":  bin.Ctl,
		"usr/local/bin/nftredir-cni": bin.CNI,
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
			t.Errorf("%s owned by %d:%d; want root", name, h.Uid, h.Gid)
		}
		src, ok := want[name]
		if !ok {
			continue
		}
		seen[name] = true
		if h.Typeflag != tar.TypeReg || h.Mode&0o777 != 0o755 {
			t.Errorf("%s: type %c mode %#o; want a 0755 file", name, h.Typeflag, h.Mode)
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
			t.Errorf("%s differs from %s", name, src)
		}
		f, err := elf.NewFile(bytes.NewReader(got))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked: a scratch image has no loader", name)
			}
		}
	}
	for n := range want {
		if !seen[n] {
			t.Errorf("the layer has no %s", n)
		}
	}
	if fi, err := os.Stat(path); err == nil {
		t.Logf("image tarball: %d KiB", fi.Size()/1024)
	}
}

// containerdTools finds containerd, ctr and runc: on PATH, or in the cache
// hack/k8s-tools.sh fills.
func containerdTools() (dir string, ok bool) {
	if p, err := exec.LookPath("containerd"); err == nil {
		d := filepath.Dir(p)
		if _, err := exec.LookPath("ctr"); err == nil {
			return d, true
		}
	}
	cache := os.Getenv("NFTREDIR_TOOLS_CACHE")
	if cache == "" {
		cache = "/var/cache/nftredir"
	}
	matches, _ := filepath.Glob(filepath.Join(cache, "k8s-*", "bin", "containerd"))
	for _, m := range matches {
		d := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(d, "ctr")); err == nil {
			return d, true
		}
	}
	return "", false
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
	path, _ := buildImage(t)
	dir, err := os.MkdirTemp("/run", "nftredir-e2e-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Snapshots of the native snapshotter are plain directories; a
		// failed run may leave a mount under state.
		exec.Command("umount", "-R", filepath.Join(dir, "state")).Run()
		os.RemoveAll(dir)
	})
	sock := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.internal.v1.tracing"]
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
		out, err := c.CombinedOutput()
		return string(out), err
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
	if out, err := ctr("images", "import", "--snapshotter", "native", path); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	ref := "docker.io/library/" + imageTag
	out, err := ctr("images", "ls", "-q")
	if err != nil || !strings.Contains(out, ref) {
		t.Fatalf("ctr images ls: %v\n%s\nwant %s (what kubelet resolves %q to)", err, out, ref, imageTag)
	}
	id := "nftredir-e2e-" + strconv.FormatUint(rand.Uint64(), 36)
	out, err = ctr("run", "--rm", "--snapshotter", "native", ref, id, "/usr/local/bin/nftredirctl", "--version")
	if err != nil || !strings.HasPrefix(out, "nftredirctl ") {
		t.Fatalf("ctr run nftredirctl --version: %v\n%s", err, out)
	}
	t.Logf("in the container: %s", strings.TrimSpace(out))
}
