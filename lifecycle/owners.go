package lifecycle

import (
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/state"
)

// owners maps each enrolled namespace to the one pod uid that owns it.
// All pods share one table name, so two records for one namespace would
// overwrite each other's rules on every reconcile, and a caller could take
// over another pod's traffic by naming its namespace under a new uid.
//
// The map is a cache of the records, rebuilt at start; it is never held
// across I/O.
type owners struct {
	mu sync.Mutex
	// protects the following fields
	byID map[netns.ID]string
}

func newOwners() *owners { return &owners{byID: map[netns.ID]string{}} }

// load indexes records; when two name one namespace the most recently
// updated one wins and reconcile drops the other.
func (o *owners) load(records []*state.Record, leftovers []state.Leftover, log hclog.Logger) {
	o.mu.Lock()
	defer o.mu.Unlock()
	newest := map[netns.ID]*state.Record{}
	for _, r := range records {
		id, err := r.NamespaceID()
		if err != nil {
			continue
		}
		if cur := newest[id]; cur != nil {
			log.Warn("two records name one namespace; keeping the newer", "netns_id", id, "pod", r.PodUID, "other", cur.PodUID)
			if !r.UpdatedAt.After(cur.UpdatedAt) {
				continue
			}
		}
		newest[id] = r
	}
	for id, r := range newest {
		o.byID[id] = r.PodUID
	}
	// A namespace a pod moved out of stays its own until cleaned up, so
	// that nobody enrols it only to have those rules removed.
	for _, r := range records {
		if r.Leaving == nil {
			continue
		}
		if id, err := netns.ParseID(r.Leaving.NetnsID); err == nil && o.byID[id] == "" {
			o.byID[id] = r.PodUID
		}
	}
	// So does a namespace left for teardown, and one its pod was moving
	// out of when released, until the leftover is settled.
	for _, l := range leftovers {
		ids := []string{l.Record.NetnsID}
		if l.Record.Leaving != nil {
			ids = append(ids, l.Record.Leaving.NetnsID)
		}
		for _, s := range ids {
			if id, err := netns.ParseID(s); err == nil && o.byID[id] == "" {
				o.byID[id] = l.Record.PodUID
			}
		}
	}
}

func (o *owners) owner(id netns.ID) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byID[id]
}

// claim gives id to uid if it is free, already uid's, or held by stale (a
// pod whose record no longer names the namespace). Otherwise it returns
// the current owner and false.
func (o *owners) claim(id netns.ID, uid, stale string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	cur := o.byID[id]
	if cur != "" && cur != uid && cur != stale {
		return cur, false
	}
	o.byID[id] = uid
	return "", true
}

// release frees id if uid holds it.
func (o *owners) release(id netns.ID, uid string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byID[id] == uid {
		delete(o.byID, id)
	}
}
