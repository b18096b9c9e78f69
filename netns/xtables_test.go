package netns

import (
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestLegacyTablesWithoutNetRaw: the legacy tables are read with the
// capabilities the chart's container has (NET_ADMIN and SYS_ADMIN, no
// NET_RAW). Reading them through a raw socket, as iptables does, failed
// there with EPERM, and every pod was refused with that error instead of
// a refusal naming the legacy rules.
func TestLegacyTablesWithoutNetRaw(t *testing.T) {
	nstest.RequirePrivileged(t)
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Skip("no iptables-legacy on this machine")
	}
	ns := nstest.NewNetns(t)
	ns.Run(t, "iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", "REDIRECT", "--to-ports", "15001")

	type result struct {
		raw    error
		tables []XTable
		err    error
	}
	done := make(chan result, 1)
	go func() {
		// The thread never goes back to the scheduler: it ends with this
		// goroutine, in the test's namespace and without NET_RAW.
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		target, err := unix.Open(ns.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			r.err = err
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			r.err = err
			return
		}
		// Capabilities are per thread: drop NET_RAW from this one's
		// effective set.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			r.err = err
			return
		}
		data[unix.CAP_NET_RAW/32].Effective &^= 1 << (unix.CAP_NET_RAW % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			r.err = err
			return
		}
		// The control: iptables' own way is refused on this thread.
		if s, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW); err == nil {
			unix.Close(s)
		} else {
			r.raw = err
		}
		r.tables, r.err = legacyHere()
	}()
	r := <-done
	if !errors.Is(r.raw, unix.EPERM) {
		t.Fatalf("raw socket without NET_RAW: %v; want EPERM (the capability was not dropped)", r.raw)
	}
	if r.err != nil {
		t.Fatalf("legacy tables without NET_RAW: %v", r.err)
	}
	var got []string
	for _, x := range r.tables {
		got = append(got, x.String())
	}
	if len(r.tables) != 1 || r.tables[0].Family != "ip" || r.tables[0].Name != "nat" || r.tables[0].Entries != 1 {
		t.Fatalf("legacy tables without NET_RAW: %v; want the nat table with its one rule", got)
	}
	t.Logf("without NET_RAW: raw socket %v; legacy tables read: %s", r.raw, strings.Join(got, ", "))
}
