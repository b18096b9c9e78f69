package kcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A test binary killed by its -timeout runs no cleanup. Its components die
// with it (Pdeathsig), but containerd's shims, the containers, mounts, the
// node namespace and the directories stay. Each cluster records its owner
// in ownerFile; Start sweeps what clusters of dead owners left.
const ownerFile = "owner"

// owner identifies the test process: its pid and start time (against pid
// reuse), and what lives outside Dir.
func (c *Cluster) writeOwner() error {
	st, err := procStart(os.Getpid())
	if err != nil {
		return err
	}
	s := fmt.Sprintf("%d %s %s %s\n", os.Getpid(), st, c.Netns.Name, c.etcdDir)
	return os.WriteFile(filepath.Join(c.Dir, ownerFile), []byte(s), 0o644)
}

// procStart is field 22 of /proc/<pid>/stat, the process's start time.
func procStart(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may hold spaces; fields count from after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return f[19], nil
}

// sweepStale removes what clusters whose owner is gone left behind.
func sweepStale(t testing.TB, tools string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kcluster-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or still starting
		}
		f := strings.Fields(string(b))
		if len(f) != 4 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		if st, err := procStart(pid); err == nil && st == f[1] {
			continue // alive
		}
		t.Logf("kcluster: sweeping %s, left by test process %d", dir, pid)
		old := &Cluster{
			Dir:              dir,
			ContainerdSocket: filepath.Join(dir, "containerd", "containerd.sock"),
			runcRoot:         filepath.Join(dir, "runc"),
			tools:            tools,
		}
		killReferencing(dir, f[3])
		old.killShims()
		old.deleteRuncContainers()
		if err := old.unmountAll(); err != nil {
			t.Logf("kcluster: sweep %s: %v", dir, err)
			continue
		}
		exec.Command("ip", "netns", "del", f[2]).Run()
		if strings.HasPrefix(f[3], "/dev/shm/kcluster-etcd-") {
			os.RemoveAll(f[3])
		}
		os.RemoveAll(dir)
	}
	// Only when nothing is left in it; see removeCgroups.
	(&Cluster{}).removeCgroups()
}

// killReferencing kills processes whose command line names one of paths
// (the components of a dead cluster, should any have survived).
func killReferencing(paths ...string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, p := range paths {
			if strings.Contains(string(b), p+"/") || strings.Contains(string(b), p+"\x00") {
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}
