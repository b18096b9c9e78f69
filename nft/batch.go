package nft

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Batch is one planned kernel transaction for one of our tables: what
// Plan or Replace decided, queued on a connection by Queue, committed
// whole or not at all by the connection's Flush. Deleting a table, chain
// or rule makes the kernel wait for an RCU grace period, and rewriting a
// set would briefly empty it, so Plan leaves everything that is right
// alone.
type Batch struct {
	t *Table
	// how the table itself is sent
	tableOp tableOp
	// delChains are chains of the table that t does not have.
	delChains []string
	// chains says what happens to each of t's chains.
	chains map[string]chainOp
	// delSets are sets deleted: not t's, or of another type or flags.
	delSets []string
	// seeds are the sets created, with the elements they start with.
	seeds map[string]map[netip.Addr]string
	// DelElems and AddElems are element changes in sets that stay: the
	// caller's (the node table's owners), address to comment.
	DelElems map[string][]netip.Addr
	AddElems map[string]map[netip.Addr]string
}

type tableOp int

const (
	tableKeep    tableOp = iota
	tableCreate          // absent: create exclusively, so a table appearing meanwhile fails the batch
	tableAdd             // present with flags: adding it sends flags 0 (v0.3.0 always does)
	tableReplace         // add, delete, add: the whole table anew, whatever was there
)

type chainOp int

const (
	chainKeep     chainOp = iota
	chainAdd              // missing
	chainRecreate         // another type, hook, priority or policy
	chainRefill           // right base, other rules (or a set under it is replaced)
)

func newBatch(t *Table) *Batch {
	return &Batch{
		t: t, chains: map[string]chainOp{}, seeds: map[string]map[netip.Addr]string{},
		DelElems: map[string][]netip.Addr{}, AddElems: map[string]map[netip.Addr]string{},
	}
}

// Elements is a batch for t that sends nothing but the element changes
// the caller adds: for a caller that knows the skeleton is in place.
func Elements(t *Table) *Batch { return newBatch(t) }

// Plan is the cheapest batch that makes the live table l into t: a
// missing table is created with all of it; otherwise only what differs is
// sent (the table to clear its flags, foreign chains and sets deleted,
// each drifted chain refilled or recreated, with the chains after an
// added one, each missing or wrong set created). seed gives the elements a created set starts with (nil: none).
// In sync, the batch is empty.
func Plan(l *Live, t *Table, seed func(set string) map[netip.Addr]string) *Batch {
	if !l.Exists() {
		return Create(t, seed)
	}
	b := newBatch(t)
	if l.Table.Flags != 0 {
		b.tableOp = tableAdd
	}
	for _, lc := range l.Table.Chains {
		if t.chain(lc.Name) == nil {
			b.delChains = append(b.delChains, lc.Name)
		}
	}
	replaced := false
	for _, s := range t.Sets {
		if l.setsOK[s.Name] {
			continue
		}
		if l.Sets[s.Name] != nil {
			b.delSets = append(b.delSets, s.Name)
			replaced = true
		}
		b.seeds[s.Name] = seedOf(seed, s.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(l.Sets)) {
		if !t.hasSet(name) {
			b.delSets = append(b.delSets, name)
		}
	}
	comment := t.Comment()
	for i := range t.Chains {
		wc := &t.Chains[i]
		switch lc := l.Table.Chain(wc.Name); {
		case lc == nil:
			b.chains[wc.Name] = chainAdd
		case !lc.SameBase(wc.base()):
			b.chains[wc.Name] = chainRecreate
		case replaced || !rulesMatch(lc, wc, comment):
			// Rules referencing a set must go before the set can.
			b.chains[wc.Name] = chainRefill
		}
	}
	// The kernel lists chains in the order they were added, and an added
	// chain goes last: every chain after one that is added is re-added
	// too, so the table lists as t renders it, whatever was repaired.
	added := false
	for _, wc := range t.Chains {
		switch op := b.chains[wc.Name]; {
		case op == chainAdd || op == chainRecreate:
			added = true
		case added:
			b.chains[wc.Name] = chainRecreate
		}
	}
	return b
}

// Create is the batch that creates t, which must be absent, exclusively:
// should a table of that name exist, the kernel refuses it all.
func Create(t *Table, seed func(set string) map[netip.Addr]string) *Batch {
	return whole(t, tableCreate, seed)
}

// Replace is the batch that replaces whatever table is there (or none)
// with t, seeding its sets: the fallback when the kernel refused a
// cheaper one because the table changed in between.
func Replace(t *Table, seed func(set string) map[netip.Addr]string) *Batch {
	return whole(t, tableReplace, seed)
}

func whole(t *Table, op tableOp, seed func(string) map[netip.Addr]string) *Batch {
	b := newBatch(t)
	b.tableOp = op
	for _, s := range t.Sets {
		b.seeds[s.Name] = seedOf(seed, s.Name)
	}
	for _, c := range t.Chains {
		b.chains[c.Name] = chainAdd
	}
	return b
}

func seedOf(seed func(string) map[netip.Addr]string, set string) map[netip.Addr]string {
	if seed == nil {
		return nil
	}
	return seed(set)
}

// Empty reports whether the batch sends nothing.
func (b *Batch) Empty() bool {
	if b.tableOp != tableKeep || len(b.delChains) > 0 || len(b.delSets) > 0 || len(b.seeds) > 0 ||
		len(b.DelElems) > 0 || len(b.AddElems) > 0 {
		return false
	}
	for _, op := range b.chains {
		if op != chainKeep {
			return false
		}
	}
	return true
}

// Queue adds the batch's messages to c, in the order the kernel needs
// them; the caller flushes, which sends them as one transaction.
func (b *Batch) Queue(c *nftables.Conn) error {
	t := &nftables.Table{Name: b.t.Name, Family: b.t.Family}
	switch b.tableOp {
	case tableCreate:
		c.CreateTable(t)
	case tableAdd:
		c.AddTable(t)
	case tableReplace:
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
	}
	for _, wc := range b.t.Chains {
		switch b.chains[wc.Name] {
		case chainRecreate:
			c.DelChain(&nftables.Chain{Name: wc.Name, Table: t})
		case chainRefill:
			c.FlushChain(&nftables.Chain{Name: wc.Name, Table: t})
		}
	}
	for _, name := range b.delChains {
		c.DelChain(&nftables.Chain{Name: name, Table: t})
	}
	for _, name := range b.delSets {
		c.DelSet(&nftables.Set{Table: t, Name: name})
	}
	created := map[string]uint32{}
	for _, s := range b.t.Sets {
		seed, ok := b.seeds[s.Name]
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
	accept := nftables.ChainPolicyAccept
	var comment []byte
	for _, wc := range b.t.Chains {
		op := b.chains[wc.Name]
		if op == chainKeep {
			continue
		}
		ch := &nftables.Chain{Name: wc.Name, Table: t}
		if op == chainAdd || op == chainRecreate {
			prio := nftables.ChainPriority(wc.Priority)
			ch = c.AddChain(&nftables.Chain{
				Name: wc.Name, Table: t, Type: wc.Type, Hooknum: wc.Hook,
				Priority: &prio, Policy: &accept,
			})
		}
		if comment == nil {
			comment = userdata.AppendString(nil, userdata.TypeComment, b.t.Comment())
		}
		for _, r := range wc.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: bindSets(r.Exprs, created), UserData: comment})
		}
	}
	for _, s := range b.t.Sets {
		if dels := b.DelElems[s.Name]; len(dels) > 0 {
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
	for _, s := range b.t.Sets {
		if adds := b.AddElems[s.Name]; len(adds) > 0 {
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
	if len(ids) == 0 {
		return exprs
	}
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

// elemChunk bounds the elements per netlink message: the element list is
// one attribute, whose length field is 16 bits, and a large set's seed or
// element changes can exceed that in a single list.
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

// DeleteTable deletes the table family/name and reports whether it was
// there. Deleting makes the kernel wait for an RCU grace period, so an
// absent table is detected with a listing first; the delete batch itself
// starts with an add, which keeps it correct should the table appear or
// vanish in between.
func DeleteTable(c *nftables.Conn, family nftables.TableFamily, name string) (bool, error) {
	if _, err := c.ListTableOfFamily(name, family); errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	t := &nftables.Table{Name: name, Family: family}
	c.AddTable(t)
	c.DelTable(t)
	return true, c.Flush()
}
