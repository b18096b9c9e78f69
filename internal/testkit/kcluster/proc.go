package kcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// proc is one component of the cluster, running in the node namespace in
// its own process group, its output in a log file.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// NodeCommand returns a command that runs name inside the node network
// namespace (and the machine's mount namespace, so it sees the cluster's
// files and pod network namespaces as the test does): nsenter enters the
// namespace and execs name in place, so the process's pid is name's own.
func (c *Cluster) NodeCommand(name string, args ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", append([]string{"--net=" + c.Netns.Path, "--", name}, args...)...)
	cmd.Env = c.env()
	return cmd
}

// env is what every component gets: the cached tools first on PATH
// (containerd finds its shim there) and nothing of the test's NFTREDIR_*
// variables, which nftredir's binaries would read as flags.
func (c *Cluster) env() []string {
	env := []string{"PATH=" + c.tools + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "NFTREDIR_") ||
			strings.HasPrefix(kv, "KUBECONFIG=") || strings.HasPrefix(kv, "CONTAINERD_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startProc starts cmd (made by NodeCommand, or any command) in its
// own process group with its output appended to logPath. Pdeathsig makes a
// test binary killed by its -timeout, which runs no cleanup, take the
// process with it; the signal follows the thread that forked, so that
// thread is held until the child exists.
func startProc(name string, cmd *exec.Cmd, logPath string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited reports an error if the process has ended.
func (p *proc) exited() error {
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); see %s", p.name, p.cmd.ProcessState, p.log)
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	pid := p.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s; killed", p.name, pid, grace)
	case <-time.After(10 * time.Second):
		return errors.New(p.name + " did not exit after SIGKILL")
	}
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// kill ends the process group with SIGKILL, as a power cut would, and
// waits until it is reaped.
func (p *proc) kill() error {
	if p == nil {
		return nil
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New(p.name + " did not exit after SIGKILL")
	}
}
