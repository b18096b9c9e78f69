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
// netns.Guard, tables programmed by an nft.Applier over netlink. Open
// enters the namespace once, to make the netlink sockets that all later
// work on the Namespace goes through (see package netns).
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
	return h, nil
}

// handle gets the real namespace back: a Namespace from another engine
// is a programming error, reported rather than panicking a request.
func handle(ns Namespace) (*netns.Handle, error) {
	h, ok := ns.(*netns.Handle)
	if !ok || h == nil {
		return nil, fmt.Errorf("capture: namespace %T was not opened by the kernel engine", ns)
	}
	return h, nil
}

// Apply looks for another agent's capture first: a namespace it refuses
// is left exactly as it was. Then it installs the routing, so the table's
// marks never point at a routing table that is not there yet, and
// replaces our table (with the foreign capture, when taking over, in the
// same transaction).
func (k *Kernel) Apply(ctx context.Context, ns Namespace, rs *nft.Ruleset, r netns.Routing) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	f, err := k.applier.FindForeign(ctx, h)
	if err != nil {
		return err
	}
	if err := CheckForeign(h.Path(), f, k.takeOver); err != nil {
		return err
	}
	if err := netns.EnsureRouting(h, r); err != nil {
		return fmt.Errorf("install policy routing: %w", err)
	}
	if !f.Empty() {
		return k.applier.TakeOver(ctx, h, rs, f)
	}
	return k.applier.Apply(ctx, h, rs)
}

// Reroute removes the old routing before installing the new one: the two
// may share a table or priority, and the kernel would keep only one.
func (k *Kernel) Reroute(_ context.Context, ns Namespace, old, r netns.Routing) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	// The new routing is ensured even when the old one could not all be
	// removed: they may share a route, which a partial removal took.
	var rmErr error
	if err := netns.RemoveRouting(h, old); err != nil {
		rmErr = fmt.Errorf("remove previous policy routing: %w", err)
	}
	if err := netns.EnsureRouting(h, r); err != nil {
		return errors.Join(rmErr, fmt.Errorf("install policy routing: %w", err))
	}
	return rmErr
}

// Remove takes the table out before the routing, the reverse of Apply.
func (k *Kernel) Remove(ctx context.Context, ns Namespace, r netns.Routing) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	if err := k.applier.Remove(ctx, h); err != nil {
		return err
	}
	return k.RemoveRouting(ctx, ns, r)
}

// RemoveRouting deletes the rules and routes of r.
func (k *Kernel) RemoveRouting(_ context.Context, ns Namespace, r netns.Routing) error {
	h, err := handle(ns)
	if err != nil {
		return err
	}
	if err := netns.RemoveRouting(h, r); err != nil {
		return fmt.Errorf("remove policy routing: %w", err)
	}
	return nil
}

// Inspect reads the table, the routing and any foreign capture.
func (k *Kernel) Inspect(ctx context.Context, ns Namespace, rs *nft.Ruleset, r netns.Routing) (Live, error) {
	h, err := handle(ns)
	if err != nil {
		return Live{}, err
	}
	st, text, err := k.applier.Verify(ctx, h, rs)
	if err != nil {
		return Live{}, fmt.Errorf("verify table: %w", err)
	}
	rt, err := netns.InspectRouting(h, r)
	if err != nil {
		return Live{}, fmt.Errorf("inspect policy routing: %w", err)
	}
	l := Live{Table: st, Text: text, Routing: rt}
	f, err := k.applier.FindForeign(ctx, h)
	if err != nil {
		return Live{}, err
	}
	if !f.Empty() {
		l.Foreign = f.String()
	}
	return l, nil
}

// Owner asks the applier whose table ns holds.
func (k *Kernel) Owner(ctx context.Context, ns Namespace) (string, bool, error) {
	h, err := handle(ns)
	if err != nil {
		return "", false, err
	}
	return k.applier.Owner(ctx, h)
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
