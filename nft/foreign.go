package nft

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftredir/nftredir/internal/nftlive"
	"github.com/nftredir/nftredir/netns"
)

// Foreign capture is another agent's traffic redirection in a pod's
// namespace: istio-cni's in-pod rules (iptables-nft chains, or since Istio
// 1.28 its own nftables tables), Istio's sidecar rules, linkerd's
// proxy-init chains. Left beside our table, a connection is captured by
// whichever chain the kernel runs first, or by rules pointing at a proxy
// that is gone (istio#58354). Legacy (xtables) iptables rules are not
// nftables objects at all: they are detected by package netns and can be
// neither read nor removed here.

// foreignChainPrefixes name the regular chains of capture agents that live
// in iptables-nft's tables (ip/ip6 nat, mangle, raw): every chain Istio's
// iptables code creates starts with ISTIO_ (ambient's ISTIO_PRERT,
// ISTIO_OUTPUT, ISTIO_OUTPUT_DNS; the sidecar's ISTIO_INBOUND,
// ISTIO_REDIRECT, ISTIO_IN_REDIRECT, ISTIO_DIVERT, ISTIO_TPROXY, ...), and
// linkerd's proxy-init chains with PROXY_INIT_ (PROXY_INIT_REDIRECT,
// PROXY_INIT_OUTPUT).
var foreignChainPrefixes = []string{"ISTIO_", "PROXY_INIT_"}

// foreignTables are whole nftables tables that belong to a capture agent:
// Istio's native nftables backend (cni/pkg/nftables: ambient; and
// tools/istio-nftables: sidecar) owns each of them outright, so the whole
// table goes.
var foreignTables = []string{
	"istio-ambient-nat", "istio-ambient-mangle", "istio-ambient-raw",
	"istio-proxy-nat", "istio-proxy-mangle", "istio-proxy-raw",
}

// Foreign is the foreign capture found in one namespace.
type Foreign struct {
	// Tables are capture agents' own tables, deleted whole on take-over.
	Tables []ForeignTable
	// Chains are capture agents' chains inside tables shared with others
	// (iptables-nft's nat, mangle and raw also hold a CNI's rules, for
	// one): only these chains, and the rules jumping to them, are taken.
	Chains []ForeignChain
	// Jumps are the rules of other chains (PREROUTING, OUTPUT, ...) that
	// jump or go to one of Chains.
	Jumps []ForeignRule
	// Legacy are the xtables tables holding rules, which nftables cannot
	// see into: a pod with any is refused.
	Legacy []netns.XTable
}

// ForeignTable is one table of a capture agent.
type ForeignTable struct {
	Family nftables.TableFamily
	Name   string
}

// ForeignChain is one chain of a capture agent in a shared table.
type ForeignChain struct {
	Family nftables.TableFamily
	Table  string
	Name   string
}

// ForeignRule is one rule, by handle, that jumps to a foreign chain.
type ForeignRule struct {
	Family nftables.TableFamily
	Table  string
	Chain  string
	Handle uint64
	Target string
}

// Empty reports whether nothing foreign was found.
func (f *Foreign) Empty() bool {
	return f == nil || len(f.Tables) == 0 && len(f.Chains) == 0 && len(f.Legacy) == 0
}

// Removable reports whether take-over can remove everything found: all of
// it but legacy rules.
func (f *Foreign) Removable() bool { return f != nil && len(f.Legacy) == 0 }

// String names what was found the way `nft list` and `iptables` do, for
// errors, Events and logs.
func (f *Foreign) String() string {
	if f.Empty() {
		return "nothing"
	}
	var parts []string
	for _, t := range f.Tables {
		parts = append(parts, fmt.Sprintf("nftables table %s %s", familyName(t.Family), t.Name))
	}
	for _, c := range f.Chains {
		parts = append(parts, fmt.Sprintf("iptables-nft chain %s %s %s", familyName(c.Family), c.Table, c.Name))
	}
	for _, x := range f.Legacy {
		parts = append(parts, "legacy "+x.String())
	}
	return strings.Join(parts, ", ")
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family(%d)", f)
}

func isForeignChain(name string) bool {
	return slices.ContainsFunc(foreignChainPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// FindForeign lists the namespace's tables and chains over netlink (and
// the rules of the tables that hold foreign chains, to find the jumps into
// them), and its legacy xtables tables through package netns. It changes
// nothing. Like Apply's routing step it does not look at ctx: a read
// is quick, and the batch that follows does.
func (n *Netlink) FindForeign(_ context.Context, ns *netns.Handle) (*Foreign, error) {
	f := &Foreign{}
	err := ns.Netfilter(func(c *nftables.Conn, _ *nftlive.Conn) error {
		return findNftables(c, f)
	})
	if err != nil {
		return nil, fmt.Errorf("list foreign capture in %s: %w", ns.Path(), err)
	}
	if f.Legacy, err = netns.LegacyTables(ns); err != nil {
		return nil, fmt.Errorf("list legacy iptables in %s: %w", ns.Path(), err)
	}
	return f, nil
}

func findNftables(c *nftables.Conn, f *Foreign) error {
	tables, err := c.ListTables()
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		if t.Family == nftables.TableFamilyINet && slices.Contains(foreignTables, t.Name) {
			f.Tables = append(f.Tables, ForeignTable{Family: t.Family, Name: t.Name})
		}
	}
	slices.SortFunc(f.Tables, func(a, b ForeignTable) int { return strings.Compare(a.Name, b.Name) })
	chains, err := c.ListChains()
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	// Only iptables-nft's families: an inet table is nftables-native and
	// its chain names are its own business (ours has none such anyway).
	type tkey struct {
		fam  nftables.TableFamily
		name string
	}
	shared := map[tkey][]*nftables.Chain{}
	for _, ch := range chains {
		if ch.Table == nil || (ch.Table.Family != nftables.TableFamilyIPv4 && ch.Table.Family != nftables.TableFamilyIPv6) {
			continue
		}
		k := tkey{ch.Table.Family, ch.Table.Name}
		shared[k] = append(shared[k], ch)
	}
	keys := make([]tkey, 0, len(shared))
	for k := range shared {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b tkey) int {
		if a.fam != b.fam {
			return int(a.fam) - int(b.fam)
		}
		return strings.Compare(a.name, b.name)
	})
	for _, k := range keys {
		var foreign []string
		for _, ch := range shared[k] {
			if isForeignChain(ch.Name) {
				foreign = append(foreign, ch.Name)
			}
		}
		if len(foreign) == 0 {
			continue
		}
		slices.Sort(foreign)
		for _, name := range foreign {
			f.Chains = append(f.Chains, ForeignChain{Family: k.fam, Table: k.name, Name: name})
		}
		// The jumps into them from the table's other chains. A jump
		// between two foreign chains goes with its chain.
		t := &nftables.Table{Family: k.fam, Name: k.name}
		for _, ch := range shared[k] {
			if isForeignChain(ch.Name) {
				continue
			}
			rules, err := c.GetRules(t, &nftables.Chain{Name: ch.Name, Table: t})
			if err != nil {
				return fmt.Errorf("list rules of %s %s %s: %w", familyName(k.fam), k.name, ch.Name, err)
			}
			for _, r := range rules {
				if target := jumpTarget(r.Exprs); target != "" && slices.Contains(foreign, target) {
					f.Jumps = append(f.Jumps, ForeignRule{Family: k.fam, Table: k.name, Chain: ch.Name, Handle: r.Handle, Target: target})
				}
			}
		}
	}
	return nil
}

// jumpTarget returns the chain a rule jumps or goes to, or "".
func jumpTarget(exprs []expr.Any) string {
	for _, e := range exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
			return v.Chain
		}
	}
	return ""
}

// TakeOver replaces the foreign capture f (as FindForeign found it) with
// rs, in one kernel transaction: the jumps into the foreign chains are
// deleted, those chains flushed and deleted, the foreign tables deleted,
// and our table replaced by rs, all in the same batch, so every packet
// meets either the foreign capture or ours, never both and never neither.
// Nothing else in the shared tables is touched: their base chains stay,
// with any rule that is not a jump into a foreign chain. Should anything
// have changed since f was read (a rule or chain gone), the kernel refuses
// the whole batch and nothing changes. Legacy rules cannot be taken over.
func (n *Netlink) TakeOver(ctx context.Context, ns *netns.Handle, rs *Ruleset, f *Foreign) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !f.Removable() {
		return fmt.Errorf("take over in %s: %s cannot be removed over netlink", ns.Path(), f)
	}
	err := ns.Netfilter(func(c *nftables.Conn, _ *nftlive.Conn) error {
		if err := queueRemoval(c, f); err != nil {
			return err
		}
		if beforeBatch != nil {
			beforeBatch()
		}
		// The full replace: it holds whatever state our table is in.
		return send(c, Replace(&rs.Table, nil))
	})
	if err != nil {
		return fmt.Errorf("take over %s in %s: %w", f, ns.Path(), err)
	}
	return nil
}

// queueRemoval adds the deletion of f's objects to c's batch, in the order
// the kernel needs: the references to a chain go before the chain.
func queueRemoval(c *nftables.Conn, f *Foreign) error {
	for _, j := range f.Jumps {
		t := &nftables.Table{Family: j.Family, Name: j.Table}
		if err := c.DelRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: j.Chain, Table: t}, Handle: j.Handle}); err != nil {
			return fmt.Errorf("delete rule %d of %s %s %s: %w", j.Handle, familyName(j.Family), j.Table, j.Chain, err)
		}
	}
	// Flushing every foreign chain first drops the jumps among them,
	// which would otherwise keep a chain in use when it is deleted.
	for _, ch := range f.Chains {
		c.FlushChain(&nftables.Chain{Name: ch.Name, Table: &nftables.Table{Family: ch.Family, Name: ch.Table}})
	}
	for _, ch := range f.Chains {
		c.DelChain(&nftables.Chain{Name: ch.Name, Table: &nftables.Table{Family: ch.Family, Name: ch.Table}})
	}
	for _, t := range f.Tables {
		c.DelTable(&nftables.Table{Family: t.Family, Name: t.Name})
	}
	return nil
}
