package nft

import (
	"context"

	"github.com/nftredir/nftredir/netns"
)

// Status is what Verify found in a namespace.
type Status int

const (
	// StatusInSync: our table is exactly the ruleset asked about.
	StatusInSync Status = iota
	// StatusDrifted: our table exists but differs (rules added, removed,
	// reordered, edited, or built from another spec).
	StatusDrifted
	// StatusAbsent: there is no table of ours.
	StatusAbsent
)

func (s Status) String() string {
	switch s {
	case StatusInSync:
		return "in sync"
	case StatusDrifted:
		return "drifted"
	case StatusAbsent:
		return "absent"
	}
	return "unknown"
}

// Applier programs rulesets into namespaces. Netlink is the only one:
// tests of callers fake the whole capture engine instead
// (capture/capturetest.Fake).
type Applier interface {
	// Apply replaces our table with rs in one kernel transaction: on error
	// the previous table (or its absence) is left exactly as it was.
	Apply(ctx context.Context, ns *netns.Handle, rs *Ruleset) error
	// Remove deletes our table; it succeeds when the table is absent.
	Remove(ctx context.Context, ns *netns.Handle) error
	// Verify compares the live table with rs. The returned text describes
	// the live table (rs's rendering for rules that match it).
	Verify(ctx context.Context, ns *netns.Handle, rs *Ruleset) (Status, string, error)
	// Owner returns the pod id our table in ns carries ("" when it cannot
	// be attributed to exactly one pod) and whether the table exists.
	Owner(ctx context.Context, ns *netns.Handle) (pod string, exists bool, err error)
	// FindForeign lists other agents' capture in ns (see Foreign); it
	// changes nothing.
	FindForeign(ctx context.Context, ns *netns.Handle) (*Foreign, error)
	// TakeOver removes the foreign capture f and replaces our table with
	// rs in one kernel transaction: on error nothing changed.
	TakeOver(ctx context.Context, ns *netns.Handle, rs *Ruleset, f *Foreign) error
}
