// Package capture puts a pod's capture into its network namespace and
// takes it out again: policy routing and the nftables table, always in the
// same order. The lifecycle engine and the ZDS server reach namespaces
// only through an Engine and the Namespaces it opens, so their logic runs the same on the kernel and
// on the in-memory capturetest.Fake, which the contract suite
// (capturetest.Run) holds to the kernel's behaviour.
package capture

import (
	"context"
	"errors"
	"fmt"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Namespace is an opened, vetted pod network namespace, and the only way
// to program it: everything done to it after Open goes through this
// value, so a path swapped after the checks cannot redirect the work
// elsewhere, and each engine's namespace carries what its own work needs.
type Namespace interface {
	// Path is what the namespace was opened from, for logs and records.
	Path() string
	// ID is the namespace's identity, read from the open file.
	ID() netns.ID
	// Fd is an open descriptor of the namespace, valid until Close; the
	// ZDS server hands it to the node proxy.
	Fd() int
	// Close releases the namespace. Safe to call twice; every other
	// method fails after it.
	Close() error

	// Apply installs the policy routing, then replaces our table with rs
	// in one transaction. On error the table is as it was; routing may
	// have been added, which the returned Change says (also on error), and
	// Undo takes out. A namespace holding another agent's capture is
	// refused with ErrForeignCapture and left untouched, unless the engine
	// takes over, which removes that capture in the same transaction;
	// legacy iptables rules are always refused.
	Apply(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (Change, error)
	// Undo takes out what one Apply did, as its Change says, and nothing
	// else: a rule or route that was there before that Apply (another
	// agent's, byte-equal to ours) stays. Another agent's capture that
	// the Apply took over cannot be put back.
	Undo(ctx context.Context, c Change) error
	// Reroute replaces the routing old with r, for a pod whose daemon
	// flags changed since it was enrolled; the table is left alone. r is
	// installed even when removing old fails (the error says so): the two
	// may share a route.
	Reroute(ctx context.Context, old, r netns.Routing) error
	// Remove deletes our table, then the routing. It succeeds when either
	// or both are already gone.
	Remove(ctx context.Context, r netns.Routing) error
	// RemoveRouting deletes only the routing, for a namespace whose table
	// is already gone or was never ours.
	RemoveRouting(ctx context.Context, r netns.Routing) error
	// Inspect compares the namespace with rs and r.
	Inspect(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (Live, error)
	// Owner returns the pod id our table carries ("" when it cannot be
	// attributed to exactly one pod) and whether the table exists.
	Owner(ctx context.Context) (pod string, exists bool, err error)
}

// Change is what one Apply did to a namespace, so that the caller can
// undo exactly that (Namespace.Undo) when the call it belongs to fails.
type Change struct {
	// Routing is what of the policy routing the Apply created.
	Routing netns.Added
	// Table: the Apply's transaction committed, so our table is the one it
	// wrote. (On error it did not commit: the table is as it was.)
	Table bool
	// TookOver: that transaction also removed another agent's capture.
	TookOver bool
}

// Live is what a namespace holds of a pod's capture right now.
type Live struct {
	// Table compares our table with the ruleset asked about.
	Table nft.Status
	// Text renders the live table in nft syntax.
	Text string
	// Routing says which of our rules and routes exist.
	Routing netns.RoutingState
	// Foreign names another agent's capture found beside ours ("" when
	// there is none; see nft.Foreign): a namespace with any is not in
	// sync, so reconcile applies the pod again, which takes it over or
	// reports the refusal.
	Foreign string
}

// InSync reports whether the namespace holds exactly the capture asked
// about.
func (l Live) InSync() bool {
	return l.Table == nft.StatusInSync && l.Routing.Complete() && l.Foreign == ""
}

// Engine opens pod namespaces; the opened Namespace programs them.
type Engine interface {
	// Open opens and vets a namespace path. Its errors wrap the netns
	// sentinels (netns.ErrNotExist, ErrNotNetns, ErrHostNetns, ...).
	Open(path string) (Namespace, error)
	// Candidates lists paths where pod namespaces may be found, for the
	// last-resort search of a record too damaged to name its own.
	Candidates() []string
}

// ErrForeignCapture: the namespace holds another agent's traffic capture
// (istio-cni's, linkerd's, or legacy iptables rules), which was not taken
// over. Stacking ours on top would capture connections twice, or hand
// them to rules pointing at a proxy that is gone; the pod is refused
// instead and nothing is changed.
var ErrForeignCapture = errors.New("the network namespace holds another agent's traffic capture")

// CheckForeign is the one rule every engine applies to the foreign
// capture it found: nil when Apply may go on (nothing found, or taking
// over what can be removed).
func CheckForeign(path string, f *nft.Foreign, takeOver bool) error {
	switch {
	case f.Empty():
		return nil
	case !f.Removable():
		return fmt.Errorf("netns_path %s: %w: %s; legacy (xtables) iptables rules can be neither read nor removed over netlink, so nothing was changed: remove them (iptables-legacy -t TABLE -F; -X) or move their owner to iptables-nft", path, ErrForeignCapture, f)
	case !takeOver:
		return fmt.Errorf("netns_path %s: %w: %s; nothing was changed: remove it, or let nftredird replace it (--take-over-foreign-capture)", path, ErrForeignCapture, f)
	}
	return nil
}
