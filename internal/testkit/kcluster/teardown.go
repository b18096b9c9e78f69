package kcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
)

// teardown stops everything Start started, in the order that lets each
// part clean up after itself, then removes by force what is left. It runs
// whatever state Start reached.
func (c *Cluster) teardown() {
	t := c.t
	if t.Failed() {
		c.dumpDiagnostics()
	}
	begin := time.Now()
	defer func() { t.Logf("kcluster: torn down in %s", time.Since(begin).Round(time.Millisecond)) }()
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// No controller may recreate what is deleted next.
	note(c.procs["kube-controller-manager"].stop(5 * time.Second))
	note(c.procs["kube-scheduler"].stop(5 * time.Second))
	// Pods deleted through the API are stopped by the kubelet, which runs
	// CNI DEL for each, as in a real cluster.
	if c.Client != nil && c.procs["kubelet"].exited() == nil && c.procs["kube-apiserver"].exited() == nil {
		if !c.deleteAllPods(20 * time.Second) {
			// A plugin that fails DEL (e.g. its daemon is already stopped)
			// keeps pods Terminating: fall back to the bridge alone.
			t.Logf("kcluster: pods left after 20s; deleting them with the bridge alone as the network")
			if err := c.writeConflist(); err == nil {
				c.deleteAllPods(15 * time.Second)
			}
		}
	}
	note(c.procs["kubelet"].stop(10 * time.Second))
	// What the kubelet left: sandboxes removed through the CRI, which
	// also unmounts and removes their network namespaces.
	var netnsPins []string
	if p := c.procs["containerd"]; p != nil && p.exited() == nil {
		netnsPins = c.removeSandboxes()
	}
	note(c.procs["containerd"].stop(10 * time.Second))
	// Forcibly: shims, containers and their mounts.
	c.killShims()
	c.deleteRuncContainers()
	note(c.procs["kube-apiserver"].stop(10 * time.Second))
	note(c.procs["etcd"].stop(10 * time.Second))
	for _, pin := range netnsPins {
		if _, err := os.Stat(pin); err == nil {
			unix.Unmount(pin, unix.MNT_DETACH)
			os.Remove(pin)
		}
	}
	note(c.unmountAll())
	c.removeCgroups()
	if os.Getenv("NFTREDIR_KCLUSTER_KEEP") == "1" {
		t.Logf("kcluster: keeping %s and %s (NFTREDIR_KCLUSTER_KEEP=1)", c.Dir, c.etcdDir)
	} else {
		if c.Dir != "" && !c.hasMounts() {
			note(os.RemoveAll(c.Dir))
		}
		if c.etcdDir != "" {
			note(os.RemoveAll(c.etcdDir))
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("kcluster teardown: %v", err)
	}
}

// deleteAllPods deletes every pod and reports whether none is left
// within d.
func (c *Cluster) deleteAllPods(d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	pods := c.Client.CoreV1()
	nss, err := pods.Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	for _, ns := range nss.Items {
		err := pods.Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false
		}
	}
	for {
		l, err := pods.Pods("").List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// removeSandboxes stops and removes every pod sandbox through the CRI and
// returns their network namespace pins, for removal should containerd
// fail to.
func (c *Cluster) removeSandboxes() []string {
	return c.walkSandboxes(func(ctx context.Context, rs runtimeapi.RuntimeServiceClient, id string) {
		rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	})
}

// walkSandboxes calls each (nil: nothing) for every sandbox the runtime
// lists, and returns their namespace pins; nil when the runtime does not
// answer.
func (c *Cluster) walkSandboxes(each func(context.Context, runtimeapi.RuntimeServiceClient, string)) []string {
	conn, err := c.criConn()
	if err != nil {
		return nil
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil
	}
	var pins []string
	for _, sb := range l.Items {
		if st, err := rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.Id, Verbose: true}); err == nil {
			if p := netnsPath(st.GetInfo()["info"]); p != "" {
				pins = append(pins, p)
			}
		}
		if each != nil {
			each(ctx, rs, sb.Id)
		}
	}
	return pins
}

// netnsPath finds the network namespace path in a sandbox's verbose info
// (containerd's runtimeSpec: {"type":"network","path":"/var/run/netns/cni-..."}).
func netnsPath(info string) string {
	const key = `"type":"network","path":"`
	i := strings.Index(info, key)
	if i < 0 {
		return ""
	}
	rest := info[i+len(key):]
	if j := strings.IndexByte(rest, '"'); j > 0 && strings.Contains(rest[:j], "/netns/") {
		return rest[:j]
	}
	return ""
}

// killShims kills the runc shims of this cluster's containerd, found by
// the -address argument they are started with. They run detached from
// containerd's process group, so its stop does not reach them.
func (c *Cluster) killShims() {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" {
			continue
		}
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == c.ContainerdSocket {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// deleteRuncContainers kills and deletes every container in this
// cluster's runc state root, which also removes their cgroups, and then
// the pod network namespace pins (/var/run/netns/cni-*) those containers
// were in, found by namespace identity: nothing else is left to remove
// them when containerd died without doing so.
func (c *Cluster) deleteRuncContainers() {
	if c.runcRoot == "" {
		return
	}
	netns := map[uint64]bool{}
	nsDirs, _ := os.ReadDir(c.runcRoot)
	for _, nd := range nsDirs {
		root := filepath.Join(c.runcRoot, nd.Name())
		ids, _ := os.ReadDir(root)
		for _, id := range ids {
			if !id.IsDir() {
				continue
			}
			if out, err := exec.Command(c.bin("runc"), "--root", root, "state", id.Name()).Output(); err == nil {
				var st struct{ Pid int }
				if json.Unmarshal(out, &st) == nil && st.Pid > 0 {
					var fi unix.Stat_t
					if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &fi) == nil {
						netns[fi.Ino] = true
					}
				}
			}
			exec.Command(c.bin("runc"), "--root", root, "kill", id.Name(), "KILL").Run()
			exec.Command(c.bin("runc"), "--root", root, "delete", "--force", id.Name()).Run()
		}
	}
	pins, _ := filepath.Glob("/var/run/netns/cni-*")
	for _, pin := range pins {
		var fi unix.Stat_t
		if unix.Stat(pin, &fi) == nil && netns[fi.Ino] {
			unix.Unmount(pin, unix.MNT_DETACH)
			os.Remove(pin)
		}
	}
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.Reverse(out) // mountinfo lists parents first
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount under the cluster's directory (volumes,
// rootfs binds, the directory's own bind) until none is left.
func (c *Cluster) unmountAll() error {
	if c.Dir == "" {
		return nil
	}
	for range 5 {
		mps := mountsUnder(c.Dir)
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
	if mps := mountsUnder(c.Dir); len(mps) > 0 {
		return fmt.Errorf("mounts left under %s: %v", c.Dir, mps)
	}
	return nil
}

func (c *Cluster) hasMounts() bool { return len(mountsUnder(c.Dir)) > 0 }

// dumpDiagnostics logs the cluster's pods and events and the tail of each
// component's log.
func (c *Cluster) dumpDiagnostics() {
	t := c.t
	if c.Client != nil && c.procs["kube-apiserver"].exited() == nil {
		if out, err := c.KubectlErr(nil, "get", "nodes,pods,daemonsets", "-A", "-o", "wide"); err == nil {
			t.Logf("kubectl get nodes,pods,daemonsets -A:\n%s", out)
		}
		if out, err := c.KubectlErr(nil, "get", "events", "-A", "--sort-by=.lastTimestamp"); err == nil {
			t.Logf("kubectl get events -A:\n%s", out)
		}
	}
	for _, name := range c.order {
		t.Logf("%s log (tail):\n%s", name, c.procs[name].tail(40))
	}
}

// removeCgroups removes the parent cgroup containerd puts every CRI
// container under when the kubelet gives none (cgroupsPerQOS is off):
// /k8s.io in every v1 hierarchy. Its leaves go with runc delete. rmdir of
// a cgroup fails while it has children or tasks, so another cluster's
// containers there are never touched.
func (c *Cluster) removeCgroups() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, d := range dirs {
		os.Remove(d)
	}
}
