package main

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// machine is what the report says about where it ran.
type machine struct {
	kernel    string
	cpu       string
	cores     int
	memory    string
	goVersion string
	nft       string
	iptables  string
	iproute   string
	revision  string // of the daemon binary, from its build info
	date      time.Time
	loadStart float64
}

func describeMachine(daemonBin string) machine {
	m := machine{
		cores:     runtime.NumCPU(),
		goVersion: runtime.Version(),
		date:      time.Now().UTC(),
		loadStart: loadAvg(),
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb int64
				fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
				m.memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	m.nft = firstLine("nft", "--version")
	m.iptables = firstLine("iptables", "--version")
	m.iproute = firstLine("ip", "-V")
	m.revision = "unknown"
	if bi, err := buildinfo.ReadFile(daemonBin); err == nil {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			m.revision = rev[:min(12, len(rev))]
			if modified == "true" {
				m.revision += " (with uncommitted changes)"
			}
			return m
		}
	}
	// Builds that did not stamp a revision (a list of packages with -o
	// dir) are, under make bench, built from the working tree we are in.
	if rev := firstLine("git", "rev-parse", "--short=12", "HEAD"); rev != "unavailable" {
		m.revision = rev + " (working tree"
		if out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(out) > 0 {
			m.revision += ", with uncommitted changes"
		}
		m.revision += ")"
	}
	return m
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "unavailable"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
