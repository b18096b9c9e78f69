package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// HeldUIDs lists every pod whose capture the daemon may still hold: the
// enrolled, the pods of quarantined records not yet released, and those
// of namespaces left for their teardown. Release takes each one's out.
func (m *Manager) HeldUIDs() ([]string, error) {
	uids, err := m.EnrolledUIDs()
	if err != nil {
		return nil, err
	}
	qs, err := m.store.QuarantinedAll()
	if err != nil {
		return nil, err
	}
	for _, q := range qs {
		if q.PodUID != "" {
			uids = append(uids, q.PodUID)
		}
	}
	ls, err := m.store.Leftovers()
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		uids = append(uids, l.Record.PodUID)
	}
	slices.Sort(uids)
	return slices.Compact(uids), nil
}

// ErrStateKept: the state directory still holds what may stand for a
// captured pod, so an uninstall left it (and the node's probe table) in
// place.
var ErrStateKept = errors.New("the state directory still names pods that may be captured; it is kept")

// ClearState removes the state directory, the last step of an uninstall
// that released every pod, but only when nothing in it may stand for a
// captured pod any more: a pod still held (HeldUIDs), a quarantined
// record that names no pod (the node's namespaces must be searched for
// its table, which RemovePod of its uid does), or a record of a newer
// format than this daemon reads (a newer daemon's, after a rollback: only
// it can release that pod). Otherwise it removes nothing and says what
// stays, wrapping ErrStateKept.
func (m *Manager) ClearState() error {
	var stays []string
	held, err := m.HeldUIDs()
	if err != nil {
		return err
	}
	for _, uid := range held {
		stays = append(stays, "pod "+uid)
	}
	qs, err := m.store.QuarantinedAll()
	if err != nil {
		return err
	}
	for _, q := range qs {
		if q.PodUID == "" {
			stays = append(stays, "quarantined record "+q.Path+" (no pod uid can be read from it)")
		}
	}
	newer, err := m.store.Newer()
	if err != nil {
		return err
	}
	for _, p := range newer {
		stays = append(stays, "record "+p+" (of a newer nftredird)")
	}
	if len(stays) > 0 {
		return fmt.Errorf("%w: %s", ErrStateKept, strings.Join(stays, ", "))
	}
	if err := os.RemoveAll(m.store.Dir()); err != nil {
		return fmt.Errorf("remove the state directory: %w", err)
	}
	return nil
}
