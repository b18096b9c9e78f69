package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/probe"
	"github.com/nftredir/nftredir/state"
)

// Phase names, in the order AddPod and RemovePod run them.
const (
	phOpen      = "open + check netns"
	phBuild     = "build ruleset (pure)"
	phGet       = "read previous record"
	phPut       = "write record (tmpfs, fsync)"
	phPutDisk   = "write record (disk, fsync)"
	phRouting   = "ip rule + route (netlink)"
	phApply     = "nft table (one netlink batch)"
	phProbe     = "node probe set: add the pod's address"
	phRPC       = "gRPC round trip (empty call)"
	phRemove    = "delete nft table"
	phUnroute   = "delete ip rule + route"
	phDelete    = "delete record"
	phProbeDel  = "node probe set: remove the pod's address"
	phAddTotal  = "AddPod's steps together, per pod"
	phCounted   = "nft table, counters on every rule (alternating)"
	phUncounted = "nft table without counters (alternating)"
	phForkExec  = "fork+exec: ip netns exec NS true"
	phForkExec2 = "fork+exec: ip -n NS rule show"
)

var addPhases = []string{phOpen, phBuild, phGet, phPut, phRouting, phApply, phProbe, phRPC}
var removePhases = []string{phOpen, phRemove, phUnroute, phDelete, phProbeDel}

// probeAt names the probe-set steps timed with n other pods in the set.
func probeAt(step string, n int) string { return fmt.Sprintf("%s, %d pods in the set", step, n) }

// phases times, in this process, the building blocks AddPod and RemovePod
// are made of, on fresh namespaces, in the order the daemon runs them:
// where the end-to-end time goes. The disk write is not part of AddPod
// (the state dir is on tmpfs); it shows what a state dir on disk would
// add. The fork+exec rows show what the exec-based baselines pay before
// doing any work.
func (b *bench) phases(ctx context.Context, d *daemon) (map[string][]time.Duration, error) {
	n := b.cfg.phasePods
	names, err := b.pool.create(n, "p")
	if err != nil {
		return nil, err
	}
	defer b.pool.remove(names)
	store, err := state.Open(filepath.Join(b.work, "phase-state"), nil)
	if err != nil {
		return nil, err
	}
	diskDir, err := os.MkdirTemp(diskRoot, fmt.Sprintf("%s%d-", namePrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(diskDir)
	disk, err := state.Open(diskDir, nil)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	// Connect before timing: the daemon's own callers keep their
	// connection, so a round trip is what they pay per call.
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		return nil, err
	}
	applier := nft.NewNetlink()
	routing := netns.DefaultRouting()
	// The daemon also keeps every pod's address in a set in the node's
	// namespace; a namespace of ours stands in for the node.
	node, err := b.pool.create(1, "pnode")
	if err != nil {
		return nil, err
	}
	pm, err := probe.New(probe.Config{NetnsPath: nsPath(node[0])})
	if err != nil {
		return nil, err
	}
	if err := pm.Ensure(ctx); err != nil {
		return nil, err
	}
	out := map[string][]time.Duration{}
	timed := func(name string, f func() error) error {
		t := time.Now()
		err := f()
		out[name] = append(out[name], time.Since(t))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		uid := fmt.Sprintf("phase-%d", i)
		var h *netns.Handle
		var rs *nft.Ruleset
		rec := benchRecord(uid, nsPath(name))
		add := []phaseStep{
			{phOpen, func() (err error) { h, err = b.guard.Open(nsPath(name)); return err }},
			{phBuild, func() (err error) { rs, err = nft.Build(nft.DefaultSpec(uid)); return err }},
			{phGet, func() error { _, err := store.Get(uid); return err }},
			{phPut, func() error { rec.NetnsID = h.ID().String(); return store.Put(rec) }},
			{phRouting, func() error { _, err := netns.EnsureRouting(h, routing); return err }},
			{phApply, func() error { return applier.Apply(ctx, h, rs) }},
			{phProbe, func() error { return pm.Add(ctx, uid, []netip.Addr{netip.MustParseAddr(podIP(name))}) }},
			{phRPC, func() error {
				_, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: client.ServiceName})
				return err
			}},
		}
		remove := []phaseStep{
			{phRemove, func() error { return applier.Remove(ctx, h) }},
			{phUnroute, func() error { return netns.RemoveRouting(h, routing) }},
			{phDelete, func() error { return store.Delete(uid) }},
			{phProbeDel, func() error { return pm.Remove(ctx, uid) }},
		}
		before := len(out[phApply])
		err := runPhases(timed, add, remove)
		if err == nil && len(out[phApply]) > before {
			var total time.Duration
			for _, name := range addPhases {
				total += out[name][len(out[name])-1]
			}
			out[phAddTotal] = append(out[phAddTotal], total)
		}
		h.Close()
		if err != nil {
			return nil, err
		}
		disk.Delete(uid)
	}
	// Separately, so its disk I/O does not slow the steps above.
	for i := range names {
		rec := benchRecord(fmt.Sprintf("phase-%d", i), "/run/netns/x")
		if err := timed(phPutDisk, func() error { return disk.Put(rec) }); err != nil {
			return nil, err
		}
	}
	// The node set is shared by all pods, and the daemon's calls on it are
	// serialised: time it again with as many pods as the reconcile case.
	crowd := map[string][]netip.Addr{}
	for i := range b.cfg.reconcilePods {
		crowd[fmt.Sprintf("crowd-%d", i)] = []netip.Addr{netip.AddrFrom4([4]byte{10, 64 + byte(i>>16), byte(i >> 8), byte(i)})}
	}
	if err := pm.Reconcile(ctx, crowd); err != nil {
		return nil, err
	}
	addAt, delAt := probeAt(phProbe, len(crowd)), probeAt(phProbeDel, len(crowd))
	for i, name := range names {
		uid := fmt.Sprintf("phase-%d", i)
		if err := timed(addAt, func() error { return pm.Add(ctx, uid, []netip.Addr{netip.MustParseAddr(podIP(name))}) }); err != nil {
			return nil, err
		}
		if err := timed(delAt, func() error { return pm.Remove(ctx, uid) }); err != nil {
			return nil, err
		}
	}
	if err := b.counterCost(ctx, timed); err != nil {
		return nil, err
	}
	for _, name := range names[:min(len(names), 20)] {
		if err := timed(phForkExec, exec.Command("ip", "netns", "exec", name, "true").Run); err != nil {
			return nil, err
		}
		if err := timed(phForkExec2, exec.Command("ip", "-n", name, "rule", "show").Run); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// counterCost times the pod table with and without its rules' counters
// on fresh namespaces, alternating which goes first so that neither gets
// a warmer kernel: what the counters cost an AddPod, measured in this run.
func (b *bench) counterCost(ctx context.Context, timed func(string, func() error) error) error {
	rs, err := nft.Build(nft.DefaultSpec("counter-cost"))
	if err != nil {
		return err
	}
	bare, err := rs.WithoutCounters()
	if err != nil {
		return err
	}
	names, err := b.pool.create(2*b.cfg.phasePods, "pc")
	if err != nil {
		return err
	}
	defer b.pool.remove(names)
	applier := nft.NewNetlink()
	for i := 0; i+1 < len(names); i += 2 {
		pair := []struct {
			name string
			rs   *nft.Ruleset
		}{{phCounted, rs}, {phUncounted, bare}}
		if i/2%2 == 1 {
			pair[0], pair[1] = pair[1], pair[0]
		}
		for j, p := range pair {
			h, err := b.guard.Open(nsPath(names[i+j]))
			if err != nil {
				return err
			}
			err = timed(p.name, func() error { return applier.Apply(ctx, h, p.rs) })
			h.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

type phaseStep struct {
	name string
	f    func() error
}

// runPhases runs the steps in order and stops at the first error. The
// remove steps reuse the add's namespace handle: RemovePod opens the
// namespace the same way AddPod does, which is timed once.
func runPhases(timed func(string, func() error) error, lists ...[]phaseStep) error {
	for _, l := range lists {
		for _, s := range l {
			if err := timed(s.name, s.f); err != nil {
				return err
			}
		}
	}
	return nil
}

// diskRoot is where the disk variant of the record write goes: a
// directory that is on disk on a typical node.
const diskRoot = "/var/tmp"

// benchRecord is the record AddPod writes for a default pod.
func benchRecord(uid, path string) *state.Record {
	now := time.Now().UTC()
	return &state.Record{
		Version:      1,
		PodUID:       uid,
		PodName:      uid,
		PodNamespace: "bench",
		NetnsPath:    path,
		NetnsID:      "0:0",
		PodIPs:       []string{dpPodAddr},
		Spec: state.SpecRecord{
			Mode:             defaults.Mode.String(),
			OutboundPort:     defaults.OutboundPort,
			InboundPort:      defaults.InboundPort,
			InboundHBONEPort: defaults.HBONEPort,
			DNSPort:          defaults.DNSPort,
			ProxyMark:        state.Mark{Value: defaults.ProxyMark, Mask: defaults.MarkMask},
			TProxyMark:       state.Mark{Value: defaults.TProxyMark, Mask: defaults.MarkMask},
			ProbeSourceV4:    defaults.ProbeSourceV4().String(),
			ProbeSourceV6:    defaults.ProbeSourceV6().String(),
			TProxyV4:         defaults.TProxyAddrV4().String(),
			TProxyV6:         defaults.TProxyAddrV6().String(),
			CaptureDNS:       defaults.CaptureDNS,
			IPv6:             defaults.IPv6,
			InboundCapture:   defaults.InboundCapture,
		},
		Routing:    state.Routing{Mark: defaults.TProxyMark, Mask: defaults.MarkMask, Table: defaults.RouteTable, Priority: defaults.RulePriority},
		EnrolledAt: now,
		UpdatedAt:  now,
	}
}
