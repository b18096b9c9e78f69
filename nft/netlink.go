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

// Apply replaces our table in one batch: add (a no-op if present), delete,
// add, chains, rules, one Flush. The kernel commits all of it or none.
func (n *Netlink) Apply(ctx context.Context, ns *netns.Handle, rs *Ruleset) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := conn(ns, false)
	if err != nil {
		return err
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
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
	if err := c.Flush(); err != nil {
		return fmt.Errorf("apply table %s in %s: %w", TableName, ns.Path(), err)
	}
	return nil
}

// Remove deletes our table. Adding it first in the same batch makes the
// delete succeed whether or not it existed.
func (n *Netlink) Remove(ctx context.Context, ns *netns.Handle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := conn(ns, false)
	if err != nil {
		return err
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
// all of ours.
func (n *Netlink) Verify(ctx context.Context, ns *netns.Handle, rs *Ruleset) (Status, string, error) {
	if err := ctx.Err(); err != nil {
		return 0, "", err
	}
	c, err := conn(ns, true)
	if err != nil {
		return 0, "", err
	}
	defer c.CloseLasting()

	t := table()
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return StatusAbsent, "", nil
		}
		return 0, "", fmt.Errorf("list table in %s: %w", ns.Path(), err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return 0, "", fmt.Errorf("list chains in %s: %w", ns.Path(), err)
	}
	var live []*nftables.Chain
	for _, ch := range all {
		if ch.Table != nil && ch.Table.Name == TableName {
			live = append(live, ch)
		}
	}
	want := map[string]Chain{}
	for _, ch := range rs.Chains {
		want[ch.Name] = ch
	}
	comment := rs.Comment()
	var problems []string
	var text strings.Builder
	fmt.Fprintf(&text, "table inet %s {\n", TableName)
	seen := map[string]bool{}
	for i, lc := range live {
		if i > 0 {
			text.WriteString("\n")
		}
		fmt.Fprintf(&text, "\tchain %s {\n", lc.Name)
		wc, ok := want[lc.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("unexpected chain %s", lc.Name))
		}
		seen[lc.Name] = true
		if lc.Hooknum != nil && lc.Priority != nil {
			fmt.Fprintf(&text, "\t\ttype %s hook %s priority %s; policy %s;\n", lc.Type, hookName(lc.Hooknum),
				priorityName(Chain{Type: lc.Type, Hook: lc.Hooknum, Priority: int32(*lc.Priority)}), policyName(lc.Policy))
		}
		if ok && !sameBase(wc, lc) {
			problems = append(problems, fmt.Sprintf("chain %s has another type, hook, priority or policy", lc.Name))
		}
		rules, err := c.GetRules(t, lc)
		if err != nil {
			return 0, "", fmt.Errorf("list rules of %s in %s: %w", lc.Name, ns.Path(), err)
		}
		if ok && len(rules) != len(wc.Rules) {
			problems = append(problems, fmt.Sprintf("chain %s has %d rules, want %d", lc.Name, len(rules), len(wc.Rules)))
		}
		for j, r := range rules {
			got, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			if ok && j < len(wc.Rules) && got == comment {
				fmt.Fprintf(&text, "\t\t%s comment %q\n", wc.Rules[j].Text, got)
				continue
			}
			if got != comment {
				problems = append(problems, fmt.Sprintf("chain %s rule %d (handle %d) is not ours or is stale", lc.Name, j+1, r.Handle))
			}
			fmt.Fprintf(&text, "\t\t# handle %d: %d expressions, comment %q (not recognised)\n", r.Handle, len(r.Exprs), got)
		}
		text.WriteString("\t}\n")
	}
	text.WriteString("}\n")
	for _, wc := range rs.Chains {
		if !seen[wc.Name] {
			problems = append(problems, fmt.Sprintf("chain %s is missing", wc.Name))
		}
	}
	if len(problems) > 0 {
		return StatusDrifted, text.String() + "# drift: " + strings.Join(problems, "; ") + "\n", nil
	}
	return StatusInSync, text.String(), nil
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
