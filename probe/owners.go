package probe

import (
	"maps"
	"net/netip"
	"slices"
)

// A set holds one element per address, and the element's comment names
// the pod that owns it. Two enrolled pods can claim one address (a pod's
// IP reused by a new pod before the old one was released); the element
// then belongs to one of them, and releasing the other must not remove it.
//
// intent is what the daemon asked for: every pod's addresses, and the
// order in which pods were added, which decides between claimants. All of
// its methods are pure; the Manager turns their answers into one batch.
type intent struct {
	pods map[string]claim
	seq  uint64
}

type claim struct {
	addrs []netip.Addr
	// seq orders adds: of several claimants, the latest add wins, as a
	// new pod that got a reused IP must be the one its probes reach.
	seq uint64
}

func newIntent() *intent { return &intent{pods: map[string]claim{}} }

// set records uid's addresses as its latest add.
func (in *intent) set(uid string, addrs []netip.Addr) {
	in.seq++
	in.pods[uid] = claim{addrs: slices.Clone(addrs), seq: in.seq}
}

func (in *intent) remove(uid string) { delete(in.pods, uid) }

// replace makes pods the whole intent. Pods already known keep their
// order; new ones are ordered by uid so the outcome is deterministic.
func (in *intent) replace(pods map[string][]netip.Addr) {
	next := make(map[string]claim, len(pods))
	for _, uid := range slices.Sorted(maps.Keys(pods)) {
		c, ok := in.pods[uid]
		if !ok {
			in.seq++
			c.seq = in.seq
		}
		c.addrs = slices.Clone(pods[uid])
		next[uid] = c
	}
	in.pods = next
}

// claimants indexes, for every wanted address, the pods claiming it.
func (in *intent) claimants() map[netip.Addr][]string {
	idx := map[netip.Addr][]string{}
	for uid, c := range in.pods {
		for _, a := range c.addrs {
			if !slices.Contains(idx[a], uid) {
				idx[a] = append(idx[a], uid)
			}
		}
	}
	return idx
}

// winner picks the owner of an address among its claimants: the current
// owner if it still claims it (no churn), otherwise the latest added.
// It returns "" when nobody claims the address.
func (in *intent) winner(uids []string, current string) string {
	if slices.Contains(uids, current) {
		return current
	}
	best := ""
	var bestSeq uint64
	for _, uid := range uids {
		if s := in.pods[uid].seq; best == "" || s > bestSeq {
			best, bestSeq = uid, s
		}
	}
	return best
}

// changes maps an address to its new owner; "" deletes the element.
type changes map[netip.Addr]string

// afterAdd: uid owns each of its addresses (the latest add wins), and
// elements uid owned that it no longer claims pass to another claimant or
// go away. Other pods' elements are not touched.
func (in *intent) afterAdd(live map[netip.Addr]string, uid string) changes {
	ch := changes{}
	for _, a := range in.pods[uid].addrs {
		ch[a] = uid
	}
	idx := in.claimants()
	for a, owner := range live {
		if owner == uid && ch[a] == "" {
			ch[a] = in.winner(idx[a], "")
		}
	}
	return ch
}

// afterRemove: elements uid owns pass to another claimant or go away;
// elements owned by anyone else stay, whatever addresses uid had.
func (in *intent) afterRemove(live map[netip.Addr]string, uid string) changes {
	ch := changes{}
	idx := in.claimants()
	for a, owner := range live {
		if owner == uid {
			ch[a] = in.winner(idx[a], "")
		}
	}
	return ch
}

// exact: every wanted address with its winner, every other element gone.
func (in *intent) exact(live map[netip.Addr]string) changes {
	ch := changes{}
	for a, uids := range in.claimants() {
		ch[a] = in.winner(uids, live[a])
	}
	for a := range live {
		if _, ok := ch[a]; !ok {
			ch[a] = ""
		}
	}
	return ch
}

// seed is the content of a set created from scratch: every wanted address
// of the set's family with its winner.
func (in *intent) seed(set string) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for a, uids := range in.claimants() {
		if setFor(a) == set {
			out[a] = in.winner(uids, "")
		}
	}
	return out
}
