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
// order in which pods were added, which decides between claimants. Its
// methods touch nothing outside it; the Manager turns their answers into
// batches.
type intent struct {
	pods map[string]claim
	// byAddr lists the claimants of every wanted address, kept up to date
	// by set and remove so that an add or remove costs the same with a
	// thousand pods as with one.
	byAddr map[netip.Addr][]string
	seq    uint64
}

type claim struct {
	addrs []netip.Addr
	// seq orders adds: of several claimants, the latest add wins, as a
	// new pod that got a reused IP must be the one its probes reach.
	seq uint64
}

func newIntent() *intent {
	return &intent{pods: map[string]claim{}, byAddr: map[netip.Addr][]string{}}
}

// set records uid's addresses as its latest add.
func (in *intent) set(uid string, addrs []netip.Addr) {
	in.unindex(uid)
	in.seq++
	in.pods[uid] = claim{addrs: slices.Clone(addrs), seq: in.seq}
	in.index(uid)
}

func (in *intent) remove(uid string) {
	in.unindex(uid)
	delete(in.pods, uid)
}

func (in *intent) index(uid string) {
	for _, a := range in.pods[uid].addrs {
		if !slices.Contains(in.byAddr[a], uid) {
			in.byAddr[a] = append(in.byAddr[a], uid)
		}
	}
}

func (in *intent) unindex(uid string) {
	for _, a := range in.pods[uid].addrs {
		// A fresh slice: claimants() hands the old one out.
		rest := slices.DeleteFunc(slices.Clone(in.byAddr[a]), func(u string) bool { return u == uid })
		if len(rest) == 0 {
			delete(in.byAddr, a)
		} else {
			in.byAddr[a] = rest
		}
	}
}

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
	in.byAddr = map[netip.Addr][]string{}
	for uid := range in.pods {
		in.index(uid)
	}
}

// claimants indexes, for every wanted address, the pods claiming it. It
// is the intent's own index: callers only read it.
func (in *intent) claimants() map[netip.Addr][]string { return in.byAddr }

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
// go away. Other pods' elements are not touched. live needs to hold only
// uid's elements; the Manager passes just those.
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
// elements owned by anyone else stay, whatever addresses uid had. As for
// afterAdd, live needs to hold only uid's elements.
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
