package probe

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/nftlive"
)

func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// live is what the kernel holds of the node table.
type live struct {
	exists  bool
	dormant bool
	// sets by name, and which of ours have the wanted type and flags
	sets   map[string]*nftables.Set
	setsOK map[string]bool
	chains []*nftlive.Chain
	// rules of our chain, if it exists
	rules []*nftlive.Rule
	// elems of our sets that are right, address to owner UID
	elems map[netip.Addr]string
}

// readLive reads the node table: the table, its chains and rules raw over
// a socket of its own in the namespace nsFd (only our table is listed, and
// rules keep every expression), the sets and their elements through c.
func readLive(c *nftables.Conn, nsFd int, rs *Ruleset) (*live, error) {
	l := &live{sets: map[string]*nftables.Set{}, setsOK: map[string]bool{}, elems: map[netip.Addr]string{}}
	rc, err := nftlive.Dial(nsFd)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	t, err := rc.ReadTable(nftables.TableFamilyINet, TableName)
	if nftlive.IsNotFound(err) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	l.exists = true
	l.dormant = t.Dormant()
	l.chains = t.Chains
	if ch := t.Chain(rs.Chain.Name); ch != nil {
		l.rules = ch.Rules
	}
	sets, err := c.GetSets(table())
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		l.sets[s.Name] = s
	}
	for _, want := range rs.Sets {
		s := l.sets[want.Name]
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
				l.elems[a] = e.Comment
			}
		}
	}
	return l, nil
}

// setOK: a plain set (no intervals, timeouts, map data) of the wanted
// address type.
func setOK(s *nftables.Set, want Set) bool {
	return s.KeyType.GetNFTMagic() == want.Type.GetNFTMagic() && s.KeyType.Bytes == want.Type.Bytes &&
		!s.Anonymous && !s.Constant && !s.Interval && !s.IsMap && !s.HasTimeout && !s.Concatenation && !s.Dynamic
}

func (l *live) chain(name string) *nftlive.Chain {
	for _, ch := range l.chains {
		if ch.Name == name {
			return ch
		}
	}
	return nil
}

func chainBaseOK(ch *nftlive.Chain, want Chain) bool {
	return ch.SameBase(nftlive.BaseChain{Type: want.Type, Hook: want.Hook, Priority: want.Priority})
}

// rulesOK compares every rule by comment and expression by expression.
func (l *live) rulesOK(rs *Ruleset) bool {
	if len(l.rules) != len(rs.Chain.Rules) {
		return false
	}
	for i, r := range l.rules {
		want := rs.Chain.Rules[i].canon
		if r.Comment != rs.Comment() || len(r.Exprs) != len(want) {
			return false
		}
		var buf []byte
		for j, e := range r.Exprs {
			if buf = nftlive.AppendCanonical(buf[:0], e); string(buf) != want[j] {
				return false
			}
		}
	}
	return true
}

// problems describes every way the live skeleton differs from rs.
func (l *live) problems(rs *Ruleset) []string {
	if !l.exists {
		return []string{"table is missing"}
	}
	var out []string
	if l.dormant {
		out = append(out, "table is dormant")
	}
	for _, s := range rs.Sets {
		switch {
		case l.sets[s.Name] == nil:
			out = append(out, fmt.Sprintf("set %s is missing", s.Name))
		case !l.setsOK[s.Name]:
			out = append(out, fmt.Sprintf("set %s has another type or flags", s.Name))
		}
	}
	for name := range l.sets {
		if !slices.ContainsFunc(rs.Sets, func(s Set) bool { return s.Name == name }) {
			out = append(out, fmt.Sprintf("unexpected set %s", name))
		}
	}
	for _, ch := range l.chains {
		if ch.Name != rs.Chain.Name {
			out = append(out, fmt.Sprintf("unexpected chain %s", ch.Name))
		}
	}
	switch ch := l.chain(rs.Chain.Name); {
	case ch == nil:
		out = append(out, fmt.Sprintf("chain %s is missing", rs.Chain.Name))
	case !chainBaseOK(ch, rs.Chain):
		out = append(out, fmt.Sprintf("chain %s has another type, hook, priority or policy", ch.Name))
	case !l.rulesOK(rs):
		out = append(out, fmt.Sprintf("chain %s has %d rules not all ours or stale, want %d", ch.Name, len(l.rules), len(rs.Chain.Rules)))
	}
	return out
}

// chainAction is what the batch does to our chain.
type chainAction int

const (
	chainKeep     chainAction = iota
	chainAdd                  // missing
	chainRecreate             // wrong type, hook, priority or policy
	chainRefill               // right base, wrong rules (or a set under it is replaced)
)

// batch is one planned transaction, in the order it is queued.
type batch struct {
	rs          *Ruleset
	addTable    bool
	delChains   []string
	chain       chainAction
	delSets     []string
	addSets     map[string]map[netip.Addr]string // recreated sets and their seed
	delElems    map[string][]netip.Addr
	addElems    map[string]map[netip.Addr]string
	problems    []string
	elemChanges int
}

func (b *batch) empty() bool {
	return !b.addTable && len(b.delChains) == 0 && b.chain == chainKeep && len(b.delSets) == 0 &&
		len(b.addSets) == 0 && len(b.delElems) == 0 && len(b.addElems) == 0
}

func newBatch(rs *Ruleset) *batch {
	return &batch{rs: rs, addSets: map[string]map[netip.Addr]string{}, delElems: map[string][]netip.Addr{}, addElems: map[string]map[netip.Addr]string{}}
}

// plan turns the live state, the element changes wanted and the seed of
// recreated sets into one batch. Objects that are right are left alone:
// deletes cost the kernel an RCU grace period, and rewriting a set would
// briefly empty it.
func plan(l *live, rs *Ruleset, ch changes, seed func(set string) map[netip.Addr]string) *batch {
	b := newBatch(rs)
	b.problems = l.problems(rs)
	// Adding the table also clears a dormant flag: v0.3.0 always sends
	// flags 0, and the kernel applies flags to an existing table.
	b.addTable = !l.exists || l.dormant

	for _, c := range l.chains {
		if c.Name != rs.Chain.Name {
			b.delChains = append(b.delChains, c.Name)
		}
	}
	replaced := false
	for _, s := range rs.Sets {
		if l.sets[s.Name] != nil && !l.setsOK[s.Name] {
			b.delSets = append(b.delSets, s.Name)
			replaced = true
		}
		if !l.setsOK[s.Name] {
			b.addSets[s.Name] = seed(s.Name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(l.sets)) {
		if !slices.ContainsFunc(rs.Sets, func(s Set) bool { return s.Name == name }) {
			b.delSets = append(b.delSets, name)
		}
	}
	switch c := l.chain(rs.Chain.Name); {
	case c == nil:
		b.chain = chainAdd
	case !chainBaseOK(c, rs.Chain):
		b.chain = chainRecreate
	case !l.rulesOK(rs) || replaced:
		// Rules referencing a set must go before the set can.
		b.chain = chainRefill
	}
	// A recreated set is filled from its seed, which already holds intent.
	b.elems(ch, l.elems, func(set string) bool { return l.setsOK[set] })
	return b
}

// elems adds the element changes ch to b. cur is what the sets hold now;
// sets that keep fails for are left out.
func (b *batch) elems(ch changes, cur map[netip.Addr]string, keep func(set string) bool) {
	for a, owner := range ch {
		set := setFor(a)
		if !keep(set) {
			continue
		}
		was, present := cur[a]
		switch {
		case owner == "" && present:
			b.delElems[set] = append(b.delElems[set], a)
		case owner == "" || (present && was == owner):
		case present:
			// Re-adding an existing key keeps its old comment, so a change
			// of owner is a delete and an add in the same batch.
			b.delElems[set] = append(b.delElems[set], a)
			fallthrough
		default:
			if b.addElems[set] == nil {
				b.addElems[set] = map[netip.Addr]string{}
			}
			b.addElems[set][a] = owner
		}
	}
	for set := range b.delElems {
		slices.SortFunc(b.delElems[set], netip.Addr.Compare)
		b.elemChanges += len(b.delElems[set])
	}
	for set := range b.addElems {
		b.elemChanges += len(b.addElems[set])
	}
}

// elemChunk bounds the elements per netlink message: the element list is
// one attribute, whose length field is 16 bits, and a coalesced removal or
// a reconcile of a large node can exceed that in a single list.
const elemChunk = 256

func chunks(els []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	for len(els) > elemChunk {
		out = append(out, els[:elemChunk])
		els = els[elemChunk:]
	}
	return append(out, els)
}

func setObject(t *nftables.Table, s Set) *nftables.Set {
	return &nftables.Set{Table: t, Name: s.Name, KeyType: s.Type, KeyByteOrder: binaryutil.BigEndian}
}

func elements(m map[netip.Addr]string) []nftables.SetElement {
	addrs := slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
	out := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, nftables.SetElement{Key: a.AsSlice(), Comment: m[a]})
	}
	return out
}

// queue adds the batch's messages to c; the caller flushes.
func (b *batch) queue(c *nftables.Conn) error {
	t := table()
	if b.addTable {
		c.AddTable(t)
	}
	for _, name := range b.delChains {
		c.DelChain(&nftables.Chain{Name: name, Table: t})
	}
	chain := &nftables.Chain{Name: b.rs.Chain.Name, Table: t}
	switch b.chain {
	case chainRecreate:
		c.DelChain(chain)
	case chainRefill:
		c.FlushChain(chain)
	}
	for _, name := range b.delSets {
		c.DelSet(&nftables.Set{Table: t, Name: name})
	}
	created := map[string]uint32{}
	for _, s := range b.rs.Sets {
		seed, ok := b.addSets[s.Name]
		if !ok {
			continue
		}
		obj := setObject(t, s)
		parts := chunks(elements(seed))
		if err := c.AddSet(obj, parts[0]); err != nil {
			return fmt.Errorf("queue set %s: %w", s.Name, err)
		}
		for _, part := range parts[1:] {
			if err := c.SetAddElements(obj, part); err != nil {
				return fmt.Errorf("queue seed of %s: %w", s.Name, err)
			}
		}
		created[s.Name] = obj.ID
	}
	if b.chain == chainAdd || b.chain == chainRecreate {
		prio := nftables.ChainPriority(b.rs.Chain.Priority)
		accept := nftables.ChainPolicyAccept
		chain = c.AddChain(&nftables.Chain{
			Name: b.rs.Chain.Name, Table: t, Type: b.rs.Chain.Type, Hooknum: b.rs.Chain.Hook,
			Priority: &prio, Policy: &accept,
		})
	}
	if b.chain != chainKeep {
		comment := userdata.AppendString(nil, userdata.TypeComment, b.rs.Comment())
		for _, r := range b.rs.Chain.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: bindSets(r.Exprs, created), UserData: comment})
		}
	}
	for _, s := range b.rs.Sets {
		if dels := b.delElems[s.Name]; len(dels) > 0 {
			els := make([]nftables.SetElement, len(dels))
			for i, a := range dels {
				els[i] = nftables.SetElement{Key: a.AsSlice()}
			}
			for _, part := range chunks(els) {
				if err := c.SetDeleteElements(setObject(t, s), part); err != nil {
					return fmt.Errorf("queue element deletes in %s: %w", s.Name, err)
				}
			}
		}
	}
	for _, s := range b.rs.Sets {
		if adds := b.addElems[s.Name]; len(adds) > 0 {
			for _, part := range chunks(elements(adds)) {
				if err := c.SetAddElements(setObject(t, s), part); err != nil {
					return fmt.Errorf("queue element adds in %s: %w", s.Name, err)
				}
			}
		}
	}
	return nil
}

// bindSets gives lookups of sets created in this batch the batch-local set
// ID, the documented way to reference a set not yet committed. The
// builder's expressions are not modified.
func bindSets(exprs []expr.Any, ids map[string]uint32) []expr.Any {
	out := slices.Clone(exprs)
	for i, e := range out {
		if lk, ok := e.(*expr.Lookup); ok {
			if id, ok := ids[lk.SetName]; ok {
				cp := *lk
				cp.SetID = id
				out[i] = &cp
			}
		}
	}
	return out
}

func (b *batch) log(log hclog.Logger) {
	if len(b.problems) > 0 {
		log.Info("node probe table repaired", "found", strings.Join(b.problems, "; "))
	}
	if b.elemChanges > 0 {
		log.Debug("node probe elements updated", "changes", b.elemChanges)
	}
}
