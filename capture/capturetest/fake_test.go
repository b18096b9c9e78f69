package capturetest_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

func TestContractFake(t *testing.T) { capturetest.Run(t, capturetest.NewFakeEnv) }

func build(t *testing.T, pod string) *nft.Ruleset {
	t.Helper()
	rs, err := nft.Build(nft.DefaultSpec(pod))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// A failed Apply leaves the table as it was, with the routing installed
// first, as a refused netlink batch does in the kernel.
func TestFakeFailedApplyKeepsTable(t *testing.T) {
	f := capturetest.NewFake()
	const path = "/run/netns/pod"
	f.AddNamespace(path)
	ns, err := f.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ctx, old, r := context.Background(), build(t, "pod-a"), netns.DefaultRouting()
	if _, err := ns.Apply(ctx, old, r); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("netlink batch refused")
	f.FailNext(capturetest.OpApply, boom)
	moved := netns.Routing{Mark: 0x222, Mask: 0xfff, Table: 101, Priority: 32000}
	if _, err := ns.Apply(ctx, build(t, "pod-b"), moved); !errors.Is(err, boom) {
		t.Fatalf("Apply = %v, want the injected error", err)
	}
	if rs, tampered := f.Table(path); rs != old || tampered {
		t.Errorf("table after a failed Apply: %v (tampered %t), want the old one", rs, tampered)
	}
	if st := f.Routing(path, moved); !st.Complete() {
		t.Errorf("routing of the failed Apply: %+v; want installed before the table", st)
	}
	if _, err := ns.Apply(ctx, old, r); err != nil {
		t.Errorf("the failure is for one call only: %v", err)
	}
}

func TestFakeInjectedFailuresAndCounts(t *testing.T) {
	f := capturetest.NewFake()
	const path = "/run/netns/pod"
	f.AddNamespace(path)
	boom := errors.New("injected")
	f.FailNext(capturetest.OpOpen, boom)
	if _, err := f.Open(path); !errors.Is(err, boom) {
		t.Fatalf("Open = %v, want injected", err)
	}
	ns, err := f.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, rs, r := context.Background(), build(t, "pod-a"), netns.DefaultRouting()
	for _, c := range []struct {
		op   capturetest.Op
		call func() error
	}{
		{capturetest.OpRemove, func() error { return ns.Remove(ctx, r) }},
		{capturetest.OpRemoveRouting, func() error { return ns.RemoveRouting(ctx, r) }},
		{capturetest.OpReroute, func() error { return ns.Reroute(ctx, r, r) }},
		{capturetest.OpInspect, func() error { _, err := ns.Inspect(ctx, rs, r); return err }},
		{capturetest.OpOwner, func() error { _, _, err := ns.Owner(ctx); return err }},
	} {
		f.FailNext(c.op, boom)
		if err := c.call(); !errors.Is(err, boom) {
			t.Errorf("%s = %v, want injected", c.op, err)
		}
		if err := c.call(); err != nil {
			t.Errorf("%s after the injected failure: %v", c.op, err)
		}
		if n := f.Calls(c.op); n != 2 {
			t.Errorf("Calls(%s) = %d, want 2", c.op, n)
		}
	}
	if n := f.Calls(capturetest.OpOpen); n != 2 {
		t.Errorf("Calls(Open) = %d, want 2", n)
	}
	// Only the Reroutes changed anything: the failed one still installed
	// r (its failure is the removal's), the repeat took r out and put it
	// back.
	base := f.Changes()
	if base != 2 {
		t.Errorf("Changes = %d before any Apply, want 2", base)
	}
	if _, err := ns.Apply(ctx, rs, r); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Apply(ctx, rs, r); err != nil {
		t.Fatal(err)
	}
	if n := f.Changes(); n != base+1 {
		t.Errorf("Changes = %d after one Apply and its repeat, want %d", n, base+1)
	}
	if n := f.OpenNamespaces(); n != 1 {
		t.Errorf("OpenNamespaces = %d, want 1", n)
	}
	ns.Close()
	if n := f.OpenNamespaces(); n != 0 {
		t.Errorf("OpenNamespaces after Close = %d", n)
	}
}

// The fd of a fake namespace is real enough to pass over SCM_RIGHTS, as
// the ZDS server does, and the receiver can tell which namespace it is.
func TestFakeFdIsSendable(t *testing.T) {
	f := capturetest.NewFake()
	f.AddNamespace("/run/netns/other")
	f.AddNamespace("/run/netns/pod")
	ns, err := f.Open("/run/netns/pod")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := unix.Sendmsg(fds[0], []byte("x"), unix.UnixRights(ns.Fd()), nil, 0); err != nil {
		t.Fatalf("send fd: %v", err)
	}
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(fds[1], make([]byte, 1), oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages: %v, %v", msgs, err)
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 1 {
		t.Fatalf("rights: %v, %v", got, err)
	}
	defer unix.Close(got[0])
	id, err := capturetest.FileID(got[0])
	if err != nil || !id.SameFile(ns.ID()) {
		t.Errorf("received fd names %s (%v), want %s", id, err, ns.ID())
	}
}

func TestFakeIdentities(t *testing.T) {
	f := capturetest.NewFake()
	const path = "/run/netns/pod"
	first := f.AddNamespace(path)
	reused := f.ReplaceReusingInode(path)
	if !reused.SameFile(first) || reused == first {
		t.Errorf("ReplaceReusingInode: %s after %s; want the same dev:ino, another cookie", reused, first)
	}
	other := f.ReplaceNamespace(path)
	if other.SameFile(first) {
		t.Errorf("ReplaceNamespace: %s after %s; want another inode", other, first)
	}
	ns, err := f.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if ns.ID() != other {
		t.Errorf("Open finds %s, want %s", ns.ID(), other)
	}
	id, err := netns.ParseID(other.String())
	if err != nil || id != other {
		t.Errorf("ID %s does not round-trip: %v, %v", other, id, err)
	}
}

func TestFakeOpenErrors(t *testing.T) {
	f := capturetest.NewFake()
	f.SetOpenError("/proc/9/ns/net", netns.ErrNoAccess)
	if _, err := f.Open("/proc/9/ns/net"); !errors.Is(err, netns.ErrNoAccess) {
		t.Errorf("Open = %v, want ErrNoAccess", err)
	}
	f.SetOpenError("/proc/9/ns/net", nil)
	if _, err := f.Open("/proc/9/ns/net"); !errors.Is(err, netns.ErrNotExist) {
		t.Errorf("Open after clearing = %v, want ErrNotExist", err)
	}
	f.AddHost("/run/netns/host")
	if _, err := f.Open("/run/netns/host"); !errors.Is(err, netns.ErrHostNetns) {
		t.Errorf("Open of the host = %v, want ErrHostNetns", err)
	}
}

func TestFakeWithoutIPv6(t *testing.T) {
	f := capturetest.NewFake()
	const path = "/run/netns/pod"
	f.AddNamespace(path)
	f.DisableIPv6(path)
	ns, err := f.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ctx, rs, r := context.Background(), build(t, "pod-a"), netns.DefaultRouting()
	if _, err := ns.Apply(ctx, rs, r); err != nil {
		t.Fatal(err)
	}
	l, err := ns.Inspect(ctx, rs, r)
	if err != nil {
		t.Fatal(err)
	}
	if !l.InSync() || l.Routing.V6Capable || l.Routing.V6Rule {
		t.Errorf("IPv4-only namespace: %+v, in sync %t", l.Routing, l.InSync())
	}
}

// Calls for different namespaces may run at once (run with -race).
func TestFakeConcurrent(t *testing.T) {
	f := capturetest.NewFake()
	rs, r := build(t, "pod-a"), netns.DefaultRouting()
	var wg sync.WaitGroup
	for i := range 8 {
		path := "/run/netns/pod" + string(rune('a'+i))
		f.AddNamespace(path)
		wg.Go(func() {
			ns, err := f.Open(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer ns.Close()
			ctx := context.Background()
			for range 20 {
				if _, err := ns.Apply(ctx, rs, r); err != nil {
					t.Error(err)
				}
				if _, err := ns.Inspect(ctx, rs, r); err != nil {
					t.Error(err)
				}
				if err := ns.Remove(ctx, r); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

// A Reroute whose removal of the old routing fails still installs the new
// one, as the kernel engine does: the two may share a route.
func TestFakeFailedRerouteInstallsTheNewRouting(t *testing.T) {
	f := capturetest.NewFake()
	const path = "/run/netns/pod"
	f.AddNamespace(path)
	ns, err := f.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ctx, rs, old := context.Background(), build(t, "pod-a"), netns.DefaultRouting()
	if _, err := ns.Apply(ctx, rs, old); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("rule delete refused")
	f.FailNext(capturetest.OpReroute, boom)
	shared := old
	shared.Priority = 32001
	if err := ns.Reroute(ctx, old, shared); !errors.Is(err, boom) {
		t.Fatalf("Reroute = %v, want the injected error", err)
	}
	if st := f.Routing(path, shared); !st.Complete() {
		t.Errorf("new routing after a failed Reroute: %+v; want installed", st)
	}
}
