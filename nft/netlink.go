package nft

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/netns"
)

// Netlink is the Applier that talks to the kernel through google/nftables,
// with a netlink socket opened inside the target namespace through its fd.
// No thread of the process ever enters the namespace.
type Netlink struct{}

var _ Applier = (*Netlink)(nil)

// NewNetlink returns the kernel applier. It holds no state: every call
// opens its own netlink socket, so calls for different pods run in
// parallel and a failed batch cannot poison the next one.
func NewNetlink() *Netlink { return &Netlink{} }

func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// closeLater closes a lasting connection off the caller's path. After a
// batch that deleted anything (a table, rules), closing the socket waits
// for an RCU grace period in the kernel, 5-25 ms here; the batch has
// already committed by then, so nobody needs to wait for the close.
func closeLater(c *nftables.Conn) { go c.CloseLasting() }

func conn(ns *netns.Handle, lasting bool) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithNetNSFd(ns.Fd())}
	if lasting {
		opts = append(opts, nftables.AsLasting())
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables in %s: %w", ns.Path(), err)
	}
	return c, nil
}

// Apply programs rs as our table in one kernel transaction. Deleting a
// table or rules makes the kernel wait for an RCU grace period (several
// milliseconds; a failed batch waits too), so Apply looks first and picks
// the cheapest batch that reaches rs from what is there:
//
//   - no table yet (a new pod): create it exclusively with its chains and
//     rules; should one appear meanwhile, EEXIST aborts the batch and the
//     full replace below runs instead;
//   - the table already verifies as rs: nothing to do;
//   - our table with exactly the wanted chains: flush its rules, add rs's;
//   - anything else: add, delete and re-add the whole table.
//
// Each is one batch: the kernel commits all of it or none.
func (n *Netlink) Apply(ctx context.Context, ns *netns.Handle, rs *Ruleset) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := conn(ns, true)
	if err != nil {
		return err
	}
	defer closeLater(c)
	live, err := snapshot(c)
	if err != nil {
		return fmt.Errorf("apply table %s in %s: %w", TableName, ns.Path(), err)
	}
	mode := replaceTable
	switch {
	case !live.exists:
		mode = createFresh
	case len(live.compare(rs)) == 0:
		return nil
	case live.flags == 0 && live.sameChains(rs):
		mode = flushRules
	}
	err = flush(c, rs, mode)
	if err != nil && mode != replaceTable {
		// The table changed between the look and the batch; the full
		// replace tolerates any prior state.
		err = flush(c, rs, replaceTable)
	}
	if err != nil {
		return fmt.Errorf("apply table %s in %s: %w", TableName, ns.Path(), err)
	}
	return nil
}

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

// liveTable is what the kernel holds of our table.
type liveTable struct {
	exists bool
	flags  uint32
	chains []*nftables.Chain
	rules  map[string][]*nftables.Rule
}

func snapshot(c *nftables.Conn) (*liveTable, error) {
	lt := &liveTable{rules: map[string][]*nftables.Rule{}}
	t, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return lt, nil
		}
		return nil, fmt.Errorf("list table: %w", err)
	}
	lt.exists = true
	// We create the table without flags. Any flag set since is someone
	// else's doing; dormant in particular switches capture off while
	// every chain and rule still looks right. (v0.3.0 decodes the flags
	// in host byte order, so only zero versus non-zero is meaningful.)
	lt.flags = t.Flags
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range all {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		lt.chains = append(lt.chains, ch)
		rules, err := c.GetRules(table(), ch)
		if err != nil {
			return nil, fmt.Errorf("list rules of %s: %w", ch.Name, err)
		}
		lt.rules[ch.Name] = rules
	}
	return lt, nil
}

// sameChains reports whether the live table has exactly rs's chains, with
// the same type, hook, priority and policy, and no others.
func (lt *liveTable) sameChains(rs *Ruleset) bool {
	want := map[string]Chain{}
	for _, ch := range rs.Chains {
		want[ch.Name] = ch
	}
	for _, lc := range lt.chains {
		wc, ok := want[lc.Name]
		if !ok || !sameBase(wc, lc) {
			return false
		}
	}
	return len(lt.chains) == len(want)
}

// compare lists every difference between the live table and rs, by chain
// shape, rule count and rule comment (which carries the spec digest).
func (lt *liveTable) compare(rs *Ruleset) []string {
	if !lt.exists {
		return []string{"table is missing"}
	}
	want := map[string]Chain{}
	for _, ch := range rs.Chains {
		want[ch.Name] = ch
	}
	comment := rs.Comment()
	var problems []string
	if lt.flags != 0 {
		problems = append(problems, "table has flags set (dormant?)")
	}
	seen := map[string]bool{}
	for _, lc := range lt.chains {
		seen[lc.Name] = true
		wc, ok := want[lc.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("unexpected chain %s", lc.Name))
			continue
		}
		if !sameBase(wc, lc) {
			problems = append(problems, fmt.Sprintf("chain %s has another type, hook, priority or policy", lc.Name))
		}
		rules := lt.rules[lc.Name]
		if len(rules) != len(wc.Rules) {
			problems = append(problems, fmt.Sprintf("chain %s has %d rules, want %d", lc.Name, len(rules), len(wc.Rules)))
		}
		for j, r := range rules {
			if got, _ := userdata.GetString(r.UserData, userdata.TypeComment); got != comment {
				problems = append(problems, fmt.Sprintf("chain %s rule %d (handle %d) is not ours or is stale", lc.Name, j+1, r.Handle))
			}
		}
	}
	for _, wc := range rs.Chains {
		if !seen[wc.Name] {
			problems = append(problems, fmt.Sprintf("chain %s is missing", wc.Name))
		}
	}
	return problems
}

// text renders the live table, using rs's text for rules whose comment
// proves they are rs's, and a placeholder for any other rule.
func (lt *liveTable) text(rs *Ruleset) string {
	want := map[string]Chain{}
	for _, ch := range rs.Chains {
		want[ch.Name] = ch
	}
	comment := rs.Comment()
	var sb strings.Builder
	fmt.Fprintf(&sb, "table inet %s {\n", TableName)
	for i, lc := range lt.chains {
		if i > 0 {
			sb.WriteString("\n")
		}
		fmt.Fprintf(&sb, "\tchain %s {\n", lc.Name)
		if lc.Hooknum != nil && lc.Priority != nil {
			fmt.Fprintf(&sb, "\t\ttype %s hook %s priority %s; policy %s;\n", lc.Type, hookName(lc.Hooknum),
				priorityName(Chain{Type: lc.Type, Hook: lc.Hooknum, Priority: int32(*lc.Priority)}), policyName(lc.Policy))
		}
		wc := want[lc.Name]
		for j, r := range lt.rules[lc.Name] {
			got, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			if got == comment && j < len(wc.Rules) {
				fmt.Fprintf(&sb, "\t\t%s comment %q\n", wc.Rules[j].Text, got)
				continue
			}
			fmt.Fprintf(&sb, "\t\t# handle %d: %d expressions, comment %q (not recognised)\n", r.Handle, len(r.Exprs), got)
		}
		sb.WriteString("\t}\n")
	}
	sb.WriteString("}\n")
	return sb.String()
}

// Remove deletes our table and succeeds when it is absent. Deleting makes
// the kernel wait for an RCU grace period, so an absent table is detected
// with a listing first; the delete batch itself starts with an add, which
// keeps it correct should the table appear or vanish in between.
func (n *Netlink) Remove(ctx context.Context, ns *netns.Handle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := conn(ns, true)
	if err != nil {
		return err
	}
	defer closeLater(c)
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); errors.Is(err, unix.ENOENT) {
		return nil
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove table %s in %s: %w", TableName, ns.Path(), err)
	}
	return nil
}

// Verify compares the live table with rs by structure and rule comments:
// same chains with the same type, hook and priority, the same number of
// rules in each, and every rule carrying rs's comment (which holds the
// spec digest). Expressions are not compared: the library cannot decode
// all of ours. The text describes the live table, with any drift listed
// at the end.
func (n *Netlink) Verify(ctx context.Context, ns *netns.Handle, rs *Ruleset) (Status, string, error) {
	if err := ctx.Err(); err != nil {
		return 0, "", err
	}
	c, err := conn(ns, true)
	if err != nil {
		return 0, "", err
	}
	defer c.CloseLasting()
	live, err := snapshot(c)
	if err != nil {
		return 0, "", fmt.Errorf("verify table %s in %s: %w", TableName, ns.Path(), err)
	}
	if !live.exists {
		return StatusAbsent, "", nil
	}
	text := live.text(rs)
	if problems := live.compare(rs); len(problems) > 0 {
		return StatusDrifted, text + "# drift: " + strings.Join(problems, "; ") + "\n", nil
	}
	return StatusInSync, text, nil
}

func sameBase(w Chain, l *nftables.Chain) bool {
	return l.Type == w.Type && l.Hooknum != nil && *l.Hooknum == *w.Hook &&
		l.Priority != nil && int32(*l.Priority) == w.Priority &&
		(l.Policy == nil || *l.Policy == nftables.ChainPolicyAccept)
}

func policyName(p *nftables.ChainPolicy) string {
	if p != nil && *p == nftables.ChainPolicyDrop {
		return "drop"
	}
	return "accept"
}

// IsNotFound reports whether err means an object did not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }
