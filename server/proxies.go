package server

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

// zdsAcked is ZDS.State of a pod the newest proxy holds.
const zdsAcked = "acked"

// zdsPod is what the node proxy is told about the pod.
func zdsPod(r *state.Record) zds.Pod {
	id, _ := r.NamespaceID() // records are checked when read
	p := zds.Pod{
		UID:       r.PodUID,
		Name:      r.PodName,
		Namespace: r.PodNamespace,
		NetnsPath: r.NetnsPath,
		NetnsID:   id,
	}
	if r.ServiceAccount != nil {
		p.ServiceAccount = *r.ServiceAccount
	}
	return p
}

// probeAddrs are the record's pod IPs as addresses. Records hold
// validated, normalised IPs; anything unparsable is skipped rather than
// failing the node table for every pod.
func probeAddrs(r *state.Record) []netip.Addr {
	out := make([]netip.Addr, 0, len(r.PodIPs))
	for _, s := range r.PodIPs {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// ZDSPods lists every enrolled pod for the snapshot a new ZDS connection
// receives. Errors are returned, never an empty list: a proxy that gets
// an empty snapshot drops every pod it serves.
func (s *Server) ZDSPods() ([]zds.Pod, error) {
	records, err := s.store.List()
	if err != nil {
		return nil, err
	}
	pods := make([]zds.Pod, len(records))
	for i, r := range records {
		pods[i] = zdsPod(r)
	}
	return pods, nil
}

// lockProbe keeps a record change and the node table change that follows
// it together, apart from the reconcile pass's full rewrite of the table:
// otherwise a pass that listed the records just before an AddPod would
// remove that pod's addresses right after AddPod added them. It returns
// the unlock.
func (s *Server) lockProbe() func() {
	if s.probe == nil {
		return func() {}
	}
	s.probeMu.RLock()
	return s.probeMu.RUnlock
}

// probeAdded puts the pod's addresses into the node table. A failure
// leaves the pod captured and its probes captured too, until the next
// reconcile pass retries; it does not fail the AddPod.
func (s *Server) probeAdded(ctx context.Context, log hclog.Logger, rec *state.Record) {
	if s.probe == nil {
		return
	}
	if err := s.probe.Add(context.WithoutCancel(ctx), rec.PodUID, probeAddrs(rec)); err != nil {
		log.Warn("cannot add the pod's addresses to the node probe table; reconcile will retry", "error", err)
	}
}

// released tells the node table and the node proxy that the pod is gone.
// The record must be deleted already, so a proxy connecting meanwhile does
// not get the pod in its snapshot.
func (s *Server) released(ctx context.Context, log hclog.Logger, uid string) {
	if s.probe != nil {
		if err := s.probe.Remove(context.WithoutCancel(ctx), uid); err != nil {
			log.Warn("cannot remove the pod's addresses from the node probe table; reconcile will retry", "error", err)
		}
	}
	if s.zds != nil {
		s.zds.PodRemoved(uid)
	}
}

// handToProxy gives the pod to the node proxy after AddPod committed it.
// Without ZDSRequireAck it returns at once. With it, it waits for the
// proxy's ack and reports a failure as Unavailable: the pod stays
// enrolled, and a repeated AddPod waits again.
func (s *Server) handToProxy(ctx context.Context, log hclog.Logger, prev, rec *state.Record) error {
	if s.zds == nil {
		return nil
	}
	// A repeated AddPod that changes nothing need not make the proxy
	// rebuild the pod's listeners.
	if state.SameIntent(prev, rec) && s.zds.State(rec.PodUID) == zdsAcked {
		return nil
	}
	if !s.zdsRequireAck {
		s.zds.PodAdded(zdsPod(rec))
		return nil
	}
	if err := s.zds.PodAddedWait(ctx, zdsPod(rec)); err != nil {
		log.Warn("node proxy has not taken the pod", "error", err)
		return proxyNotTaken(rec.PodUID, err)
	}
	return nil
}

// withZDSState adds the pod's ZDS state to p when ZDS is served.
func (s *Server) withZDSState(p *nftredirv1.Pod) *nftredirv1.Pod {
	if s.zds != nil && p != nil {
		p.ZdsState = proto.String(s.zds.State(p.GetPodUid()))
	}
	return p
}

// reconcileProbe makes the node table exactly the enrolled pods' addresses.
// The records are listed again here, after the pass dropped what it
// dropped; if they cannot be listed the table is left alone, since an
// empty map would empty it.
func (s *Server) reconcileProbe(ctx context.Context) {
	if s.probe == nil || ctx.Err() != nil {
		return
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	records, err := s.store.List()
	if err != nil {
		s.log.Warn("cannot list records; node probe table left as it is until the next pass", "error", err)
		return
	}
	pods := make(map[string][]netip.Addr, len(records))
	for _, r := range records {
		pods[r.PodUID] = probeAddrs(r)
	}
	if err := s.probe.Reconcile(ctx, pods); err != nil {
		s.log.Error("cannot reconcile the node probe table; retrying next pass", "error", err)
	}
}
