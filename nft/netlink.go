package nft

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
	"github.com/nftredir/nftredir/netns"
)

// Netlink is the Applier that talks to the kernel through google/nftables,
// over the netlink sockets the namespace's handle made inside it when it
// was opened (see netns.Handle.Netfilter), so no call enters the
// namespace again.
type Netlink struct{}

var _ Applier = (*Netlink)(nil)

// NewNetlink returns the kernel applier. It holds no state: the sockets
// belong to each namespace's handle, so calls for different pods run in
// parallel, and a handle drops its sockets after a failed batch, which
// then cannot poison the next one.
func NewNetlink() *Netlink { return &Netlink{} }

// Apply programs rs as our table in one kernel transaction. Deleting a
// table or rules makes the kernel wait for an RCU grace period (several
// milliseconds; a failed batch waits too), so Apply reads the table first
// and sends the cheapest batch that reaches rs from what is there (Plan):
//
//   - no table yet (a new pod): create it exclusively with its chains and
//     rules; should one appear meanwhile, EEXIST aborts the batch and the
//     full replace below runs instead;
//   - the table already verifies as rs (every expression of every rule):
//     nothing to do;
//   - anything else: only what differs (a drifted chain refilled or
//     recreated, a foreign chain deleted, flags cleared); should the
//     kernel refuse it, the full replace: add, delete and re-add the
//     whole table.
//
// Each is one batch: the kernel commits all of it or none.
func (n *Netlink) Apply(ctx context.Context, ns *netns.Handle, rs *Ruleset) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := ns.Netfilter(func(c *nftables.Conn, r *nftlive.Conn) error {
		live, err := ReadLive(c, r, &rs.Table)
		if err != nil {
			return err
		}
		b := Plan(live, &rs.Table, nil)
		if b.Empty() {
			return nil
		}
		if beforeBatch != nil {
			beforeBatch()
		}
		if err := send(c, b); err != nil {
			return &retryReplace{err: err}
		}
		return nil
	})
	if retry := (*retryReplace)(nil); errors.As(err, &retry) {
		// The table changed between the look and the batch; the full
		// replace tolerates any prior state. It runs on fresh sockets:
		// a refused batch may have left acks unread on the old ones,
		// which the retry would take for its own.
		err = ns.Netfilter(func(c *nftables.Conn, _ *nftlive.Conn) error {
			return send(c, Replace(&rs.Table, nil))
		})
	}
	if err != nil {
		return fmt.Errorf("apply table %s in %s: %w", TableName, ns.Path(), err)
	}
	return nil
}

// beforeBatch, set only by tests, runs between Apply's look at the table
// and its batch: where a concurrent change makes the batch fail.
var beforeBatch func()

// retryReplace is a planned batch the kernel refused, to be repeated as
// the full replace.
type retryReplace struct{ err error }

func (e *retryReplace) Error() string { return e.err.Error() }
func (e *retryReplace) Unwrap() error { return e.err }

// send queues b on c and commits it.
func send(c *nftables.Conn, b *Batch) error {
	if err := b.Queue(c); err != nil {
		return err
	}
	return c.Flush()
}

// Remove deletes our table and succeeds when it is absent (see
// DeleteTable).
func (n *Netlink) Remove(ctx context.Context, ns *netns.Handle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := ns.Netfilter(func(c *nftables.Conn, _ *nftlive.Conn) error {
		_, err := DeleteTable(c, nftables.TableFamilyINet, TableName)
		return err
	})
	if err != nil {
		return fmt.Errorf("remove table %s in %s: %w", TableName, ns.Path(), err)
	}
	return nil
}

// Verify compares the live table with rs: the table's flags, the chains
// with their type, hook, priority and policy, and every rule, expression
// by expression (including tproxy and socket, which the library cannot
// decode) and by comment. The text renders what the kernel holds, with
// any drift listed at the end.
func (n *Netlink) Verify(ctx context.Context, ns *netns.Handle, rs *Ruleset) (Status, string, error) {
	if err := ctx.Err(); err != nil {
		return 0, "", err
	}
	var live *Live
	err := ns.Netfilter(func(c *nftables.Conn, r *nftlive.Conn) (err error) {
		live, err = ReadLive(c, r, &rs.Table)
		return err
	})
	if err != nil {
		return 0, "", fmt.Errorf("verify table %s in %s: %w", TableName, ns.Path(), err)
	}
	if !live.Exists() {
		return StatusAbsent, "", nil
	}
	if problems := live.Problems(&rs.Table); len(problems) > 0 {
		return StatusDrifted, live.Text(&rs.Table, false) + "# drift: " + strings.Join(problems, "; ") + "\n", nil
	}
	return StatusInSync, live.Text(&rs.Table, true), nil
}

// IsNotFound reports whether err means an object did not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }
