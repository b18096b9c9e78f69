package lifecycle

import (
	"context"
	"net/netip"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
	"github.com/nftredir/nftredir/zds"
)

// ZDS is the node proxy's view of enrolled pods; *zds.Server is one.
type ZDS interface {
	// PodAdded hands the pod to the proxy without waiting.
	PodAdded(zds.Pod)
	// PodAddedWait hands the pod to the proxy and waits for its ack.
	PodAddedWait(context.Context, zds.Pod) error
	// PodRemoved takes the pod away from every connected proxy.
	PodRemoved(uid string)
	// State says where the pod stands with the newest proxy.
	State(uid string) string
}

// ProbeTable is the node table that lets kubelet probes past capture;
// *probe.Manager is one.
type ProbeTable interface {
	Add(ctx context.Context, uid string, addrs []netip.Addr) error
	Remove(ctx context.Context, uid string) error
	Reconcile(ctx context.Context, pods map[string][]netip.Addr) error
}

// probeAddrs are the record's pod IPs as addresses. Records hold
// validated, normalised IPs; anything unparsable is skipped rather than
// failing the node table for every pod.
func probeAddrs(r *state.Record) []netip.Addr {
	out := make([]netip.Addr, 0, len(r.PodIPs))
	for _, ip := range r.PodIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// lockProbe keeps a record change and the node table change that follows
// it together, apart from the reconcile pass's full rewrite of the table:
// otherwise a pass that listed the records just before an AddPod would
// remove that pod's addresses right after AddPod added them. It returns
// the unlock.
func (m *Manager) lockProbe() func() {
	if m.probe == nil {
		return func() {}
	}
	m.probeMu.RLock()
	return m.probeMu.RUnlock
}

// probeAdded puts the pod's addresses into the node table. A failure
// leaves the pod captured and its probes captured too, until the next
// reconcile pass retries; it does not fail the AddPod.
func (m *Manager) probeAdded(ctx context.Context, log hclog.Logger, rec *state.Record) {
	if m.probe == nil {
		return
	}
	if err := m.probe.Add(context.WithoutCancel(ctx), rec.PodUID, probeAddrs(rec)); err != nil {
		log.Warn("cannot add the pod's addresses to the node probe table; reconcile will retry", "error", err)
	}
}

// released tells the node table and the node proxy that the pod is gone.
// The record must be deleted (or left for teardown) already, so a proxy
// connecting meanwhile does not get the pod in its snapshot.
func (m *Manager) released(ctx context.Context, log hclog.Logger, uid string) {
	if m.probe != nil {
		if err := m.probe.Remove(context.WithoutCancel(ctx), uid); err != nil {
			log.Warn("cannot remove the pod's addresses from the node probe table; reconcile will retry", "error", err)
		}
	}
	if m.zds != nil {
		m.zds.PodRemoved(uid)
	}
}

// handToProxy gives the pod to the node proxy after AddPod committed it.
// Without ZDSRequireAck it returns at once. With it, it waits for the
// proxy's ack and returns why there was none; the caller decides what
// stays of the pod (addLocked).
func (m *Manager) handToProxy(ctx context.Context, log hclog.Logger, prev, rec *state.Record) error {
	if m.zds == nil {
		return nil
	}
	// A repeated AddPod that changes nothing need not make the proxy
	// rebuild the pod's listeners.
	if state.SameIntent(prev, rec) && m.zds.State(rec.PodUID) == zds.StateAcked {
		return nil
	}
	if !m.zdsRequireAck {
		m.zds.PodAdded(zds.PodOf(rec))
		return nil
	}
	if err := m.zds.PodAddedWait(ctx, zds.PodOf(rec)); err != nil {
		log.Warn("node proxy has not taken the pod", "error", err)
		return err
	}
	return nil
}

// withZDSState adds the pod's ZDS state to p when ZDS is served.
func (m *Manager) withZDSState(p *nftredirv1.Pod) *nftredirv1.Pod {
	if m.zds != nil && p != nil {
		p.ZdsState = proto.String(m.zds.State(p.GetPodUid()))
	}
	return p
}

// reconcileProbe makes the node table exactly the enrolled pods' addresses.
// The records are listed again here, after the pass dropped what it
// dropped; if they cannot be listed the table is left alone, since an
// empty map would empty it.
func (m *Manager) reconcileProbe(ctx context.Context) {
	if m.probe == nil || ctx.Err() != nil {
		return
	}
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	records, err := m.store.List()
	if err != nil {
		m.log.Warn("cannot list records; node probe table left as it is until the next pass", "error", err)
		return
	}
	pods := make(map[string][]netip.Addr, len(records))
	for _, r := range records {
		pods[r.PodUID] = probeAddrs(r)
	}
	if err := m.probe.Reconcile(ctx, pods); err != nil {
		m.log.Error("cannot reconcile the node probe table; retrying next pass", "error", err)
	}
}
