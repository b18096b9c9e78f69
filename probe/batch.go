package probe

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/nftlive"
	"github.com/nftredir/nftredir/nft"
)

// readLive reads the node table through the engine: the table, its chains
// and rules raw over a socket of its own in the namespace nsFd (only our
// table is listed, and rules keep every expression), the sets and their
// elements through c.
func readLive(c *nftables.Conn, nsFd int, rs *Ruleset) (*nft.Live, error) {
	rc, err := nftlive.Dial(nsFd)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return nft.ReadLive(c, rc, &rs.Table)
}

// batch is one planned transaction: the engine's batch for the skeleton
// plus the element changes of the Manager's owners.
type batch struct {
	*nft.Batch
	problems    []string
	elemChanges int
}

// plan turns the live state, the element changes wanted and the seed of
// recreated sets into one batch. Objects that are right are left alone
// (see nft.Plan).
func plan(l *nft.Live, rs *Ruleset, ch changes, seed func(set string) map[netip.Addr]string) *batch {
	b := &batch{Batch: nft.Plan(l, &rs.Table, seed), problems: l.Problems(&rs.Table)}
	// A recreated set is filled from its seed, which already holds intent.
	b.elems(ch, l.Elems, l.SetOK)
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
			b.DelElems[set] = append(b.DelElems[set], a)
		case owner == "" || (present && was == owner):
		case present:
			// Re-adding an existing key keeps its old comment, so a change
			// of owner is a delete and an add in the same batch.
			b.DelElems[set] = append(b.DelElems[set], a)
			fallthrough
		default:
			if b.AddElems[set] == nil {
				b.AddElems[set] = map[netip.Addr]string{}
			}
			b.AddElems[set][a] = owner
		}
	}
	for set := range b.DelElems {
		slices.SortFunc(b.DelElems[set], netip.Addr.Compare)
		b.elemChanges += len(b.DelElems[set])
	}
	for set := range b.AddElems {
		b.elemChanges += len(b.AddElems[set])
	}
}

func (b *batch) log(log hclog.Logger) {
	if len(b.problems) > 0 {
		log.Info("node probe table repaired", "found", strings.Join(b.problems, "; "))
	}
	if b.elemChanges > 0 {
		log.Debug("node probe elements updated", "changes", b.elemChanges)
	}
}
