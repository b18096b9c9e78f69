package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// namePrefix starts every namespace and directory the benchmark creates.
// The creating process's pid follows it, so a sweep can tell the leftovers
// of a dead run from the live objects of a concurrent one.
const namePrefix = "nftr-bench-"

const netnsDir = "/run/netns"

// pool creates and removes the benchmark's namespaces and remembers the
// live ones, so that cleanup after an error or a signal finds them all.
type pool struct {
	prefix string
	seq    atomic.Int64

	mu   sync.Mutex
	live map[string]bool // protected by mu
}

func newPool() *pool {
	return &pool{prefix: fmt.Sprintf("%s%d-", namePrefix, os.Getpid()), live: map[string]bool{}}
}

func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// create makes n fresh namespaces with lo up. One `ip -batch` process
// creates all of them, because per-namespace processes would make setup
// dominate the run; lo is raised over netlink for the same reason.
func (p *pool) create(n int, tag string) ([]string, error) {
	names := make([]string, n)
	var script strings.Builder
	for i := range names {
		names[i] = fmt.Sprintf("%s%s%d", p.prefix, tag, p.seq.Add(1))
		fmt.Fprintf(&script, "netns add %s\n", names[i])
	}
	p.mu.Lock()
	for _, name := range names {
		p.live[name] = true
	}
	p.mu.Unlock()
	if err := ipBatch("", script.String()); err != nil {
		return nil, fmt.Errorf("create %d namespaces: %w", n, err)
	}
	for _, name := range names {
		if err := loUp(name); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func loUp(name string) error {
	ns, err := vnetns.GetFromPath(nsPath(name))
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rtnetlink in %s: %w", name, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("lo up in %s: %w", name, err)
	}
	return nil
}

// remove deletes namespaces; ones already gone are not an error. The
// kernel tears a namespace down asynchronously after its last reference
// goes, so callers that time the next thing should settle first.
func (p *pool) remove(names []string) error {
	var script strings.Builder
	for _, name := range names {
		if _, err := os.Stat(nsPath(name)); err == nil {
			fmt.Fprintf(&script, "netns del %s\n", name)
		}
	}
	var err error
	if script.Len() > 0 {
		err = ipBatch("", script.String())
	}
	p.mu.Lock()
	for _, name := range names {
		delete(p.live, name)
	}
	p.mu.Unlock()
	return err
}

// drop deletes one namespace at once, as a container runtime does after
// CNI DEL: in-process, unmounting and unlinking its bind mount (what `ip
// netns del` and containerd's netns.Remove do), so that no process start
// sits between a chain's timed calls. A namespace it fails to delete stays
// live, for remove or removeAll to retry.
func (p *pool) drop(name string) error {
	path := nsPath(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	p.mu.Lock()
	delete(p.live, name)
	p.mu.Unlock()
	return nil
}

func (p *pool) removeAll() error {
	p.mu.Lock()
	names := make([]string, 0, len(p.live))
	for name := range p.live {
		names = append(names, name)
	}
	p.mu.Unlock()
	return p.remove(names)
}

// ipBatch runs one `ip [-n ns] -batch -` over script.
func ipBatch(ns, script string) error {
	args := []string{"-batch", "-"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	cmd := exec.Command("ip", args...)
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// sweep removes what earlier runs left behind when they were killed too
// hard to clean up: namespaces and work directories whose creating pid is
// no longer alive. A concurrent run's objects carry a live pid and stay.
func sweep() (int, error) {
	var errs []error
	removed := 0
	entries, _ := os.ReadDir(netnsDir)
	var script strings.Builder
	for _, e := range entries {
		if deadOwner(e.Name()) {
			fmt.Fprintf(&script, "netns del %s\n", e.Name())
			removed++
		}
	}
	if script.Len() > 0 {
		if err := ipBatch("", script.String()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, root := range []string{workRoot, diskRoot} {
		dirs, _ := os.ReadDir(root)
		for _, e := range dirs {
			if e.IsDir() && deadOwner(e.Name()) {
				if err := removeWorkDir(filepath.Join(root, e.Name())); err != nil {
					errs = append(errs, err)
				}
				removed++
			}
		}
	}
	return removed, errors.Join(errs...)
}

// deadOwner reports whether name is one of ours and its pid is gone.
func deadOwner(name string) bool {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return false
	}
	pidText, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return false
	}
	return pid != os.Getpid() && !alive(pid)
}

// alive reports whether pid is a running process. A zombie is not: where
// PID 1 does not reap orphans, a killed run stays one indefinitely.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
