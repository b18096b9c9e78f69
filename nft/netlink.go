package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
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

func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// Apply programs rs as our table in one kernel transaction. Deleting a
// table or rules makes the kernel wait for an RCU grace period (several
// milliseconds; a failed batch waits too), so Apply looks first and picks
// the cheapest batch that reaches rs from what is there:
//
//   - no table yet (a new pod): create it exclusively with its chains and
//     rules; should one appear meanwhile, EEXIST aborts the batch and the
//     full replace below runs instead;
//   - the table already verifies as rs (every expression of every rule):
//     nothing to do;
//   - our table with exactly the wanted chains: flush its rules, add rs's;
//   - anything else: add, delete and re-add the whole table.
//
// Each is one batch: the kernel commits all of it or none.
func (n *Netlink) Apply(ctx context.Context, ns *netns.Handle, rs *Ruleset) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := ns.Netfilter(func(c *nftables.Conn, r *nftlive.Conn) error {
		live, err := readLive(r)
		if err != nil {
			return err
		}
		mode := replaceTable
		switch {
		case live == nil:
			mode = createFresh
		case len(compare(live, rs)) == 0:
			return nil
		case live.Flags == 0 && sameChains(live, rs):
			mode = flushRules
		}
		if beforeBatch != nil {
			beforeBatch()
		}
		if err := flush(c, rs, mode); err != nil {
			if mode != replaceTable {
				return &retryReplace{err: err}
			}
			return err
		}
		return nil
	})
	if retry := (*retryReplace)(nil); errors.As(err, &retry) {
		// The table changed between the look and the batch; the full
		// replace tolerates any prior state. It runs on fresh sockets:
		// a refused batch may have left acks unread on the old ones,
		// which the retry would take for its own.
		err = ns.Netfilter(func(c *nftables.Conn, _ *nftlive.Conn) error {
			return flush(c, rs, replaceTable)
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

// retryReplace is a batch of a cheaper mode the kernel refused, to be
// repeated as the full replace.
type retryReplace struct{ err error }

func (e *retryReplace) Error() string { return e.err.Error() }
func (e *retryReplace) Unwrap() error { return e.err }

type applyMode int

const (
	createFresh applyMode = iota
	flushRules
	replaceTable
)

func flush(c *nftables.Conn, rs *Ruleset, mode applyMode) error {
	t := table()
	switch mode {
	case createFresh:
		c.CreateTable(t)
	case flushRules:
		c.AddTable(t)
		c.FlushTable(t)
	case replaceTable:
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
	}
	comment := userdata.AppendString(nil, userdata.TypeComment, rs.Comment())
	accept := nftables.ChainPolicyAccept
	for _, ch := range rs.Chains {
		prio := nftables.ChainPriority(ch.Priority)
		chain := c.AddChain(&nftables.Chain{
			Name: ch.Name, Table: t, Type: ch.Type, Hooknum: ch.Hook,
			Priority: &prio, Policy: &accept,
		})
		for _, r := range ch.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: r.Exprs, UserData: comment})
		}
	}
	return c.Flush()
}

// readLive reads our table, raw; nil when there is no table.
func readLive(c *nftlive.Conn) (*nftlive.Table, error) {
	t, err := c.ReadTable(nftables.TableFamilyINet, TableName)
	if nftlive.IsNotFound(err) {
		return nil, nil
	}
	return t, err
}

func (ch Chain) base() nftlive.BaseChain {
	return nftlive.BaseChain{Type: ch.Type, Hook: ch.Hook, Priority: ch.Priority}
}

// sameChains reports whether the live table has exactly rs's chains, with
// the same type, hook, priority and policy, and no others.
func sameChains(lt *nftlive.Table, rs *Ruleset) bool {
	if len(lt.Chains) != len(rs.Chains) {
		return false
	}
	for _, wc := range rs.Chains {
		if lc := lt.Chain(wc.Name); lc == nil || !lc.SameBase(wc.base()) {
			return false
		}
	}
	return true
}

// ruleMatches reports whether the kernel's rule is want: the same
// expressions (compared as Canonical describes) and our comment.
func ruleMatches(lr *nftlive.Rule, want *Rule, comment string) bool {
	if lr.Comment != comment || len(lr.Exprs) != len(want.canon) {
		return false
	}
	var buf []byte
	for i, e := range lr.Exprs {
		if buf = nftlive.AppendCanonical(buf[:0], e); string(buf) != want.canon[i] {
			return false
		}
	}
	return true
}

// compare lists every difference between the live table and rs: flags,
// chains and their base shape, and every expression and comment of every
// rule.
func compare(lt *nftlive.Table, rs *Ruleset) []string {
	if lt == nil {
		return []string{"table is missing"}
	}
	comment := rs.Comment()
	var problems []string
	if lt.Dormant() {
		problems = append(problems, "table is dormant")
	} else if lt.Flags != 0 {
		problems = append(problems, fmt.Sprintf("table has flags %#x", lt.Flags))
	}
	var dict *vocabulary
	for _, lc := range lt.Chains {
		wi := slices.IndexFunc(rs.Chains, func(c Chain) bool { return c.Name == lc.Name })
		if wi < 0 {
			problems = append(problems, fmt.Sprintf("unexpected chain %s", lc.Name))
			continue
		}
		wc := &rs.Chains[wi]
		if !lc.SameBase(wc.base()) {
			problems = append(problems, fmt.Sprintf("chain %s has another type, hook, priority or policy", lc.Name))
		}
		if len(lc.Rules) != len(wc.Rules) {
			problems = append(problems, fmt.Sprintf("chain %s has %d rules, want %d", lc.Name, len(lc.Rules), len(wc.Rules)))
		}
		for j, lr := range lc.Rules {
			switch {
			case j >= len(wc.Rules):
			case lr.Comment != comment:
				problems = append(problems, fmt.Sprintf("chain %s rule %d (handle %d) is not ours or is stale", lc.Name, j+1, lr.Handle))
			case !ruleMatches(lr, &wc.Rules[j], comment):
				if dict == nil {
					dict = newVocabulary(rs)
				}
				problems = append(problems, fmt.Sprintf("chain %s rule %d (handle %d) is %q, want %q", lc.Name, j+1, lr.Handle, dict.render(lr.Exprs), wc.Rules[j].Text))
			}
		}
	}
	for _, wc := range rs.Chains {
		if lt.Chain(wc.Name) == nil {
			problems = append(problems, fmt.Sprintf("chain %s is missing", wc.Name))
		}
	}
	return problems
}

// text renders the live table the way `nft list table` prints it. A rule
// that is exactly rs's (every expression and the comment) is printed with
// rs's text and the kernel's counter values; any other is read back from its expressions (see vocabulary),
// so the listing shows what the kernel holds, never what was meant.
// inSync says compare found nothing, so every rule is known to be rs's.
func text(lt *nftlive.Table, rs *Ruleset, inSync bool) string {
	comment := rs.Comment()
	var dict *vocabulary
	var sb strings.Builder
	fmt.Fprintf(&sb, "table inet %s {\n", TableName)
	if lt.Flags != 0 {
		fmt.Fprintf(&sb, "\tflags %s\n", tableFlagNames(lt.Flags))
	}
	for i, lc := range lt.Chains {
		if i > 0 {
			sb.WriteString("\n")
		}
		fmt.Fprintf(&sb, "\tchain %s {\n", lc.Name)
		if lc.Base {
			hook := lc.Hook
			fmt.Fprintf(&sb, "\t\ttype %s hook %s priority %s; policy %s;\n", lc.Type, hookName(&hook),
				priorityName(Chain{Type: lc.Type, Hook: &hook, Priority: lc.Priority}), policyName(&lc.Policy))
		}
		var wc *Chain
		if wi := slices.IndexFunc(rs.Chains, func(c Chain) bool { return c.Name == lc.Name }); wi >= 0 {
			wc = &rs.Chains[wi]
		}
		for j, lr := range lc.Rules {
			var rt string
			if wc != nil && j < len(wc.Rules) && (inSync || ruleMatches(lr, &wc.Rules[j], comment)) {
				rt = wc.Rules[j].countedText(lr.Exprs)
			} else {
				if dict == nil {
					dict = newVocabulary(rs)
				}
				rt = dict.render(lr.Exprs)
			}
			if lr.Comment != "" {
				rt += fmt.Sprintf(" comment %q", lr.Comment)
			}
			fmt.Fprintf(&sb, "\t\t%s\n", rt)
		}
		sb.WriteString("\t}\n")
	}
	sb.WriteString("}\n")
	return sb.String()
}

func tableFlagNames(f uint32) string {
	var names []string
	if f&unix.NFT_TABLE_F_DORMANT != 0 {
		names = append(names, "dormant")
		f &^= unix.NFT_TABLE_F_DORMANT
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("%#x", f))
	}
	return strings.Join(names, ",")
}

// Remove deletes our table and succeeds when it is absent. Deleting makes
// the kernel wait for an RCU grace period, so an absent table is detected
// with a listing first; the delete batch itself starts with an add, which
// keeps it correct should the table appear or vanish in between.
func (n *Netlink) Remove(ctx context.Context, ns *netns.Handle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := ns.Netfilter(func(c *nftables.Conn, _ *nftlive.Conn) error {
		if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); errors.Is(err, unix.ENOENT) {
			return nil
		}
		t := table()
		c.AddTable(t)
		c.DelTable(t)
		return c.Flush()
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
	var live *nftlive.Table
	err := ns.Netfilter(func(_ *nftables.Conn, r *nftlive.Conn) (err error) {
		live, err = readLive(r)
		return err
	})
	if err != nil {
		return 0, "", fmt.Errorf("verify table %s in %s: %w", TableName, ns.Path(), err)
	}
	if live == nil {
		return StatusAbsent, "", nil
	}
	if problems := compare(live, rs); len(problems) > 0 {
		return StatusDrifted, text(live, rs, false) + "# drift: " + strings.Join(problems, "; ") + "\n", nil
	}
	return StatusInSync, text(live, rs, true), nil
}

func policyName(p *nftables.ChainPolicy) string {
	if p != nil && *p == nftables.ChainPolicyDrop {
		return "drop"
	}
	return "accept"
}

// IsNotFound reports whether err means an object did not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }
