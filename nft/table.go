package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// Table is one table nftredir owns, as a pure value: the pod table (Build)
// and the node's probe table (package probe) are both Tables, built from
// the same words (build.go), encoded and digested the same way, applied by
// the same batch (batch.go), and read back and compared by the same code
// (live.go). Only their specs differ.
type Table struct {
	Name   string
	Family nftables.TableFamily
	// ID, when set, is hashed into the digest first (the pod table's pod
	// id), so one owner's table never verifies as another's.
	ID string
	// Label starts every rule's comment ("nftredir pod=<uid>"); the
	// digest follows it (see Comment).
	Label string
	// Digest identifies the table's content: a hash of ID, the sets, the
	// chains and every rule's encoded expressions, so any change to what
	// a builder emits changes it, with no version number to bump. Encode
	// sets it; every rule's comment carries it.
	Digest string
	// Sets are the table's named sets, without elements: those change at
	// run time and are the caller's (see Batch).
	Sets   []Set
	Chains []Chain
}

// Chain is one base chain of a table (we never jump), policy accept.
type Chain struct {
	Name     string
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority int32
	Rules    []Rule
}

// Set is one named set: a plain set (no flags) of Type.
type Set struct {
	Name string
	Type nftables.SetDatatype
}

// Rule is one rule: the expressions sent to the kernel and the same rule in
// nft syntax, as `nft list table` prints it (without the comment).
type Rule struct {
	Exprs []expr.Any
	Text  string

	// parts are the words the rule was built from, for reading a drifted
	// kernel rule back in the same vocabulary.
	parts []Word
	// wire is Exprs as the library encodes them; canon is each in the
	// form the comparison with the kernel's uses (Encode fills both).
	wire  []nftlive.Expr
	canon []string
}

// baseChain is one row of a table's static skeleton: a chain without its
// rules.
type baseChain struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority int32
}

func (c baseChain) with(rules ...Rule) Chain {
	return Chain{Name: c.name, Type: c.typ, Hook: c.hook, Priority: c.priority, Rules: rules}
}

func (ch Chain) base() nftlive.BaseChain {
	return nftlive.BaseChain{Type: ch.Type, Hook: ch.Hook, Priority: ch.Priority}
}

// Encode fills every rule's wire and canonical form and derives the
// digest from them: the hash covers exactly what the kernel is sent (ID,
// set names and types, chains, every expression's bytes). Builders call
// it last.
func (t *Table) Encode() error {
	d := nftlive.NewDigest()
	if t.ID != "" {
		d.Field([]byte(t.ID))
	}
	for _, st := range t.Sets {
		d.Field(fmt.Appendf(nil, "set %s %s", st.Name, st.Type.Name))
	}
	for ci := range t.Chains {
		ch := &t.Chains[ci]
		d.Field(fmt.Appendf(nil, "chain %s %s %d %d", ch.Name, ch.Type, *ch.Hook, ch.Priority))
		for ri := range ch.Rules {
			r := &ch.Rules[ri]
			wire, err := nftlive.Encode(t.Family, r.Exprs)
			if err != nil {
				return fmt.Errorf("table %s chain %s rule %d: %w", t.Name, ch.Name, ri+1, err)
			}
			r.wire, r.canon = wire, nftlive.CanonicalAll(wire)
			d.Rule(wire)
		}
	}
	t.Digest = d.String()
	return nil
}

// Comment is the comment every rule of t carries: whose table it is and
// which content built it.
func (t *Table) Comment() string { return t.Label + commentDigestSep + t.Digest }

// WithoutCounters is t with every rule's counter left out (and its own
// digest): what the table was before rules counted, for measuring what
// the counters cost (make bench). The daemon never programs it.
func (t *Table) WithoutCounters() (*Table, error) {
	out := *t
	out.Chains = make([]Chain, len(t.Chains))
	for i, c := range t.Chains {
		c.Rules = make([]Rule, 0, len(c.Rules))
		for _, r := range t.Chains[i].Rules {
			c.Rules = append(c.Rules, assemble(slices.DeleteFunc(slices.Clone(r.parts), isCounter)))
		}
		out.Chains[i] = c
	}
	if err := out.Encode(); err != nil {
		return nil, err
	}
	return &out, nil
}

// Bytecode renders every rule's expressions as they are sent to the
// kernel, one line per expression (its name and NFTA_EXPR_DATA in hex),
// under the rule's nft text: the pure tier's view of the bytecode, which
// the text alone does not pin down (an offset or a register can change
// while the text stays the same).
func (t *Table) Bytecode() string {
	var sb strings.Builder
	for _, c := range t.Chains {
		fmt.Fprintf(&sb, "chain %s\n", c.Name)
		for i, r := range c.Rules {
			fmt.Fprintf(&sb, "\trule %d: %s\n", i+1, r.Text)
			for _, e := range r.wire {
				fmt.Fprintf(&sb, "\t\t%-9s %x\n", e.Name, e.Data)
			}
		}
	}
	return sb.String()
}

// String renders the table the way `nft list table` prints it while its
// sets are empty, comments included.
func (t *Table) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "table %s %s {\n", familyName(t.Family), t.Name)
	for _, s := range t.Sets {
		fmt.Fprintf(&sb, "\tset %s {\n\t\ttype %s\n\t}\n\n", s.Name, s.Type.Name)
	}
	for i, c := range t.Chains {
		if i > 0 {
			sb.WriteString("\n")
		}
		fmt.Fprintf(&sb, "\tchain %s {\n", c.Name)
		fmt.Fprintf(&sb, "\t\ttype %s hook %s priority %s; policy accept;\n", c.Type, hookName(c.Hook), priorityName(c))
		for _, r := range c.Rules {
			fmt.Fprintf(&sb, "\t\t%s comment %q\n", r.Text, t.Comment())
		}
		sb.WriteString("\t}\n")
	}
	sb.WriteString("}\n")
	return sb.String()
}

func (t *Table) chain(name string) *Chain {
	if i := slices.IndexFunc(t.Chains, func(c Chain) bool { return c.Name == name }); i >= 0 {
		return &t.Chains[i]
	}
	return nil
}

func (t *Table) hasSet(name string) bool {
	return slices.ContainsFunc(t.Sets, func(s Set) bool { return s.Name == name })
}

func hookName(h *nftables.ChainHook) string {
	switch *h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	case *nftables.ChainHookForward:
		return "forward"
	}
	return fmt.Sprintf("hook(%d)", *h)
}

// PrioritySrcNAT is nft's srcnat: NAT of packets leaving, after routing
// chose their source address (the node table's chain).
const PrioritySrcNAT = 100

// priorityName prints priorities the way nft does for the inet family:
// within 10 of a standard priority its name and the offset ("mangle +
// 10", "dstnat - 10"), when the name is valid for the hook (dstnat only on
// prerouting, srcnat only on postrouting); otherwise the number.
func priorityName(c Chain) string {
	const reach = 10
	std := []struct {
		val  int32
		name string
		hook *nftables.ChainHook
	}{
		{-300, "raw", nil}, {-150, "mangle", nil}, {-100, "dstnat", nftables.ChainHookPrerouting},
		{0, "filter", nil}, {50, "security", nil}, {PrioritySrcNAT, "srcnat", nftables.ChainHookPostrouting},
	}
	for _, p := range std {
		off := c.Priority - p.val
		if off < -reach || off > reach {
			continue
		}
		if p.hook != nil && *p.hook != *c.Hook {
			break // as nft: the nearest standard name does not apply
		}
		switch {
		case off > 0:
			return fmt.Sprintf("%s + %d", p.name, off)
		case off < 0:
			return fmt.Sprintf("%s - %d", p.name, -off)
		}
		return p.name
	}
	return fmt.Sprint(c.Priority)
}
