package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Kernel is the Engine of the real node: namespaces opened through a
// netns.Guard, tables programmed by an nft.Applier over netlink. A
// Namespace enters its namespace once, to make the netlink sockets that
// all later work on it goes through (see package netns): at Open, or at
// its first use where Open can identify the namespace without entering.
type Kernel struct {
	guard   *netns.Guard
	applier nft.Applier
	// netnsDirs hold bind-mounted namespaces; Candidates lists them and
	// every process's namespace.
	netnsDirs []string
	// takeOver: Apply replaces another agent's capture instead of
	// refusing the namespace (see ErrForeignCapture).
	takeOver bool
}

// KernelOption configures NewKernel.
type KernelOption func(*Kernel)

// TakeOverForeign makes Apply replace another agent's capture found in a
// namespace (istio-cni's, linkerd's; see nft.Foreign) with ours in one
// transaction, instead of refusing it. Legacy iptables rules are refused
// either way.
func TakeOverForeign(on bool) KernelOption { return func(k *Kernel) { k.takeOver = on } }

var _ Engine = (*Kernel)(nil)

// NewKernel returns the kernel engine. guard and applier are required.
func NewKernel(guard *netns.Guard, applier nft.Applier, opts ...KernelOption) *Kernel {
	// iproute2's directory and most CNI runtimes'.
	k := &Kernel{guard: guard, applier: applier, netnsDirs: []string{"/run/netns", "/var/run/netns"}}
	for _, o := range opts {
		o(k)
	}
	return k
}

// Open opens path through the guard.
func (k *Kernel) Open(path string) (Namespace, error) {
	h, err := k.guard.Open(path)
	if err != nil {
		return nil, err
	}
	return &kernelNamespace{Handle: h, applier: k.applier, takeOver: k.takeOver}, nil
}

// kernelNamespace is a namespace the kernel engine opened: the guard's
// handle (Path, ID, Fd, Close) and what programming it takes.
type kernelNamespace struct {
	*netns.Handle
	applier  nft.Applier
	takeOver bool
}

// Apply looks for another agent's capture first: a namespace it refuses
// is left exactly as it was. Then it installs the routing, so the table's
// marks never point at a routing table that is not there yet, and
// replaces our table (with the foreign capture, when taking over, in the
// same transaction).
func (ns *kernelNamespace) Apply(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (Change, error) {
	h := ns.Handle
	var c Change
	f, err := ns.applier.FindForeign(ctx, h)
	if err != nil {
		return c, err
	}
	if err := CheckForeign(h.Path(), f, ns.takeOver); err != nil {
		return c, err
	}
	if c.Routing, err = netns.EnsureRouting(h, r); err != nil {
		return c, fmt.Errorf("install policy routing: %w", err)
	}
	if !f.Empty() {
		if err := ns.applier.TakeOver(ctx, h, rs, f); err != nil {
			return c, err
		}
		c.Table, c.TookOver = true, true
		return c, nil
	}
	if err := ns.applier.Apply(ctx, h, rs); err != nil {
		return c, err
	}
	c.Table = true
	return c, nil
}

// Undo deletes the table when the Apply wrote it, then the routing it
// created.
func (ns *kernelNamespace) Undo(ctx context.Context, c Change) error {
	if c.Table {
		if err := ns.applier.Remove(ctx, ns.Handle); err != nil {
			return err
		}
	}
	if err := netns.RemoveAdded(ns.Handle, c.Routing); err != nil {
		return fmt.Errorf("remove the policy routing it added: %w", err)
	}
	return nil
}

// Reroute removes the old routing before installing the new one: the two
// may share a table or priority, and the kernel would keep only one.
func (ns *kernelNamespace) Reroute(_ context.Context, old, r netns.Routing) error {
	h := ns.Handle
	// The new routing is ensured even when the old one could not all be
	// removed: they may share a route, which a partial removal took.
	var rmErr error
	if err := netns.RemoveRouting(h, old); err != nil {
		rmErr = fmt.Errorf("remove previous policy routing: %w", err)
	}
	if _, err := netns.EnsureRouting(h, r); err != nil {
		return errors.Join(rmErr, fmt.Errorf("install policy routing: %w", err))
	}
	return rmErr
}

// Remove takes the table out before the routing, the reverse of Apply.
func (ns *kernelNamespace) Remove(ctx context.Context, r netns.Routing) error {
	if err := ns.applier.Remove(ctx, ns.Handle); err != nil {
		return err
	}
	return ns.RemoveRouting(ctx, r)
}

// RemoveRouting deletes the rules and routes of r.
func (ns *kernelNamespace) RemoveRouting(_ context.Context, r netns.Routing) error {
	if err := netns.RemoveRouting(ns.Handle, r); err != nil {
		return fmt.Errorf("remove policy routing: %w", err)
	}
	return nil
}

// Inspect reads the table, the routing and any foreign capture.
func (ns *kernelNamespace) Inspect(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (Live, error) {
	h := ns.Handle
	st, text, err := ns.applier.Verify(ctx, h, rs)
	if err != nil {
		return Live{}, fmt.Errorf("verify table: %w", err)
	}
	rt, err := netns.InspectRouting(h, r)
	if err != nil {
		return Live{}, fmt.Errorf("inspect policy routing: %w", err)
	}
	l := Live{Table: st, Text: text, Routing: rt}
	f, err := ns.applier.FindForeign(ctx, h)
	if err != nil {
		return Live{}, err
	}
	if !f.Empty() {
		l.Foreign = f.String()
	}
	return l, nil
}

// Owner asks the applier whose table ns holds.
func (ns *kernelNamespace) Owner(ctx context.Context) (string, bool, error) {
	return ns.applier.Owner(ctx, ns.Handle)
}

// Candidates lists the bind-mounted namespaces, then every process's.
func (k *Kernel) Candidates() []string {
	var paths []string
	for _, d := range k.netnsDirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			paths = append(paths, filepath.Join(d, e.Name()))
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if n := e.Name(); n[0] >= '0' && n[0] <= '9' {
			paths = append(paths, filepath.Join("/proc", n, "ns", "net"))
		}
	}
	return paths
}
