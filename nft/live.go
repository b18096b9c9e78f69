package nft

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// Live is what the kernel holds of one of our tables, read by ReadLive:
// the table alone, never another table, chain or set of the namespace.
type Live struct {
	// Table is the table with its flags, chains and rules, raw (see
	// internal/nftlive); nil when there is no such table.
	Table *nftlive.Table
	// Sets are the table's sets by name, read only for a table whose spec
	// has sets (the pod table has none, and is read without the extra
	// round trip).
	Sets map[string]*nftables.Set
	// Elems are the elements of the wanted sets that are right (setOK),
	// address to comment.
	Elems map[netip.Addr]string

	setsOK map[string]bool
}

// Exists reports whether the table is there.
func (l *Live) Exists() bool { return l.Table != nil }

// SetOK reports whether the set called name is there with the wanted type
// and no flags; its elements are then in Elems.
func (l *Live) SetOK(name string) bool { return l.setsOK[name] }

// ReadLive reads the table t describes: its flags, chains and all their
// rules in raw dumps over r, and, when t has sets, its sets and their
// elements over c.
func ReadLive(c *nftables.Conn, r *nftlive.Conn, t *Table) (*Live, error) {
	l := &Live{Sets: map[string]*nftables.Set{}, Elems: map[netip.Addr]string{}, setsOK: map[string]bool{}}
	lt, err := readTable(r, t.Family, t.Name)
	if err != nil || lt == nil {
		return l, err
	}
	l.Table = lt
	if len(t.Sets) == 0 {
		return l, nil
	}
	sets, err := c.GetSets(&nftables.Table{Name: t.Name, Family: t.Family})
	if err != nil {
		return nil, fmt.Errorf("list sets of %s: %w", t.Name, err)
	}
	for _, s := range sets {
		l.Sets[s.Name] = s
	}
	for _, want := range t.Sets {
		s := l.Sets[want.Name]
		if s == nil || !setOK(s, want) {
			continue
		}
		l.setsOK[want.Name] = true
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		for _, e := range els {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				l.Elems[a] = e.Comment
			}
		}
	}
	return l, nil
}

// readTable reads one table raw; nil when there is none.
func readTable(r *nftlive.Conn, family nftables.TableFamily, name string) (*nftlive.Table, error) {
	t, err := r.ReadTable(family, name)
	if nftlive.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read table %s: %w", name, err)
	}
	return t, nil
}

// setOK: a plain set (no intervals, timeouts, map data) of the wanted
// type.
func setOK(s *nftables.Set, want Set) bool {
	return s.KeyType.GetNFTMagic() == want.Type.GetNFTMagic() && s.KeyType.Bytes == want.Type.Bytes &&
		!s.Anonymous && !s.Constant && !s.Interval && !s.IsMap && !s.HasTimeout && !s.Concatenation && !s.Dynamic
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

// rulesMatch reports whether the live chain holds exactly want's rules.
func rulesMatch(lc *nftlive.Chain, want *Chain, comment string) bool {
	if len(lc.Rules) != len(want.Rules) {
		return false
	}
	for i, lr := range lc.Rules {
		if !ruleMatches(lr, &want.Rules[i], comment) {
			return false
		}
	}
	return true
}

// Problems lists every difference between the live table and t: flags,
// sets (their type and flags, not their elements), chains and their base
// shape, and every expression and comment of every rule. None means in
// sync.
func (l *Live) Problems(t *Table) []string {
	lt := l.Table
	if lt == nil {
		return []string{"table is missing"}
	}
	comment := t.Comment()
	var problems []string
	if lt.Dormant() {
		problems = append(problems, "table is dormant")
	} else if lt.Flags != 0 {
		problems = append(problems, fmt.Sprintf("table has flags %#x", lt.Flags))
	}
	for _, s := range t.Sets {
		switch {
		case l.Sets[s.Name] == nil:
			problems = append(problems, fmt.Sprintf("set %s is missing", s.Name))
		case !l.setsOK[s.Name]:
			problems = append(problems, fmt.Sprintf("set %s has another type or flags", s.Name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(l.Sets)) {
		if !t.hasSet(name) {
			problems = append(problems, fmt.Sprintf("unexpected set %s", name))
		}
	}
	var dict *vocabulary
	for _, lc := range lt.Chains {
		wc := t.chain(lc.Name)
		if wc == nil {
			problems = append(problems, fmt.Sprintf("unexpected chain %s", lc.Name))
			continue
		}
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
					dict = newVocabulary(t)
				}
				problems = append(problems, fmt.Sprintf("chain %s rule %d (handle %d) is %q, want %q", lc.Name, j+1, lr.Handle, dict.render(lr.Exprs), wc.Rules[j].Text))
			}
		}
	}
	for _, wc := range t.Chains {
		if lt.Chain(wc.Name) == nil {
			problems = append(problems, fmt.Sprintf("chain %s is missing", wc.Name))
		}
	}
	return problems
}

// Text renders the live table the way `nft list table` prints it (sets
// left out). A rule that is exactly t's (every expression and the
// comment) is printed with t's text and the kernel's counter values; any
// other is read back from its expressions (see vocabulary), so the
// listing shows what the kernel holds, never what was meant. inSync says
// Problems found nothing, so every rule is known to be t's.
func (l *Live) Text(t *Table, inSync bool) string {
	lt := l.Table
	comment := t.Comment()
	var dict *vocabulary
	var sb strings.Builder
	fmt.Fprintf(&sb, "table %s %s {\n", familyName(t.Family), t.Name)
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
				priorityName(Chain{Type: lc.Type, Hook: &hook, Priority: lc.Priority}), policyName(lc.Policy))
		}
		wc := t.chain(lc.Name)
		for j, lr := range lc.Rules {
			var rt string
			if wc != nil && j < len(wc.Rules) && (inSync || ruleMatches(lr, &wc.Rules[j], comment)) {
				rt = wc.Rules[j].countedText(lr.Exprs)
			} else {
				if dict == nil {
					dict = newVocabulary(t)
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

func policyName(p nftables.ChainPolicy) string {
	if p == nftables.ChainPolicyDrop {
		return "drop"
	}
	return "accept"
}
