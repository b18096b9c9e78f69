package kube

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftredir/nftredir/netns/pins"
)

// Why a running pod's namespace was or was not found: the outcomes of
// DiscoveryStats, and (those that refuse) the reasons of the pod's
// Warning Event.
const (
	DiscoveryProven    = "proven"
	DiscoveryNotFound  = "not_found"
	DiscoveryAmbiguous = "ambiguous"
	DiscoveryNoPodIP   = "no_pod_ip"
	DiscoveryFailed    = "scan_failed"

	// ReasonNamespaceNotFound: no pinned namespace carries the pod's IPs.
	ReasonNamespaceNotFound = "NamespaceNotFound"
	// ReasonNamespaceAmbiguous: more than one does; nftredir will not guess.
	ReasonNamespaceAmbiguous = "NamespaceAmbiguous"
	// ReasonNamespaceScanFailed: the pin directories could not be read.
	ReasonNamespaceScanFailed = "NamespaceScanFailed"
)

// DiscoveryOutcomes lists every outcome, for metrics that show each from
// the start.
var DiscoveryOutcomes = []string{DiscoveryProven, DiscoveryNotFound, DiscoveryAmbiguous, DiscoveryNoPodIP, DiscoveryFailed}

// ScanMaxAge is how old a pin scan may be and still serve a pod. A label
// selecting many running pods queues them all at once; they share one
// scan. A stale scan cannot enrol a wrong namespace: AddPod reopens the
// pin and requires the identity (cookie included) the proof recorded. A
// refusal from a stale scan is retried after retryFirst with a fresh one.
const ScanMaxAge = time.Second

// Retries of a pod whose namespace was not proven: pods gain IPs and
// pins appear within seconds of a sandbox starting, so the first retry
// is soon; then the delay doubles up to the agent's sweep period.
const retryFirst = time.Second

// DiscoveryStats are the agent's namespace discovery counters.
type DiscoveryStats struct {
	// Outcomes counts pods looked for, by outcome (DiscoveryOutcomes).
	Outcomes map[string]uint64
	// Unproven is how many pods the policy selects are waiting for their
	// namespace to be proven.
	Unproven int
	// Scans and ScanSeconds count the pin scans and their total time.
	Scans       uint64
	ScanSeconds float64
}

// discovery is the agent's record of running pods it looked for.
type discovery struct {
	mu sync.Mutex
	// protects the following fields
	unproven map[string]*unproven
	outcomes map[string]uint64
	lastScan *pins.Scan
	scans    uint64
	scanSecs float64
}

// unproven is a pod the policy selects whose namespace was not proven.
type unproven struct {
	reason   string
	attempts int
	at       time.Time
}

// DiscoveryStats returns the counters.
func (a *Agent) DiscoveryStats() DiscoveryStats {
	d := &a.disc
	d.mu.Lock()
	defer d.mu.Unlock()
	s := DiscoveryStats{Outcomes: map[string]uint64{}, Unproven: len(d.unproven), Scans: d.scans, ScanSeconds: d.scanSecs}
	for _, o := range DiscoveryOutcomes {
		s.Outcomes[o] = d.outcomes[o]
	}
	return s
}

// discover finds the namespace of a running pod the policy selects and
// the agent never saw a sandbox of, proves it is the pod's (see package
// pins), and remembers it as a sighting, so that the pod is enrolled the
// way a sighting always is. It returns nil, having logged and told the
// pod why, when the namespace cannot be proven; a retry is queued.
func (a *Agent) discover(ctx context.Context, log hclog.Logger, pod *corev1.Pod) (*sighting, error) {
	uid := string(pod.UID)
	if a.pins == nil {
		log.Debug("pod should be captured, but its namespace is unknown and pin discovery is off; its next sandbox enrols it")
		return nil, nil
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	ips := podIPs(pod)
	if len(ips) == 0 {
		// No sandbox network yet: its CNI ADD, or the status update
		// carrying its IPs, brings the pod back here.
		a.countDiscovery(DiscoveryNoPodIP)
		log.Debug("pod should be captured; it has no IP yet to find its namespace by")
		return nil, nil
	}
	sc, err := a.pins.Recent(ctx, ScanMaxAge)
	if err != nil {
		a.refuse(log, pod, DiscoveryFailed, ReasonNamespaceScanFailed, err)
		return nil, nil
	}
	a.noteScan(sc)
	pin, err := sc.Find(ips)
	switch {
	case errors.Is(err, pins.ErrNotFound):
		a.refuse(log, pod, DiscoveryNotFound, ReasonNamespaceNotFound, err)
		return nil, nil
	case errors.Is(err, pins.ErrAmbiguous):
		a.refuse(log, pod, DiscoveryAmbiguous, ReasonNamespaceAmbiguous, err)
		return nil, nil
	case err != nil:
		a.refuse(log, pod, DiscoveryFailed, ReasonNamespaceScanFailed, err)
		return nil, nil
	}
	v := sighting{
		PodUID: uid, Namespace: pod.Namespace, Name: pod.Name,
		NetnsPath: pin.Path, NetnsID: pin.ID.String(),
		SeenAt: time.Now().UTC(),
	}
	for _, ip := range ips {
		v.PodIPs = append(v.PodIPs, ip.String())
	}
	if err := a.seen.put(v); err != nil {
		return nil, err
	}
	a.countDiscovery(DiscoveryProven)
	a.disc.mu.Lock()
	delete(a.disc.unproven, uid)
	a.disc.mu.Unlock()
	log.Info("running pod's namespace found and proven by its IPs", "netns", pin.Path, "netns_id", v.NetnsID, "pod_ips", v.PodIPs, "pins", len(sc.Pins), "scan_took", sc.Took.Round(time.Microsecond).String())
	return &v, nil
}

// refuse tells why a running pod's namespace was not proven: a Warning
// Event and a warning line when the reason is new for the pod, a debug
// line on retries, and a retry after a backoff.
func (a *Agent) refuse(log hclog.Logger, pod *corev1.Pod, outcome, reason string, err error) {
	uid := string(pod.UID)
	a.countDiscovery(outcome)
	d := &a.disc
	d.mu.Lock()
	u := d.unproven[uid]
	fresh := u == nil || u.reason != reason
	if u == nil {
		u = &unproven{}
		d.unproven[uid] = u
	}
	u.reason, u.at = reason, time.Now()
	delay := min(retryFirst<<min(u.attempts, 16), a.sweep)
	u.attempts++
	d.mu.Unlock()
	if fresh {
		log.Warn("pod should be captured, but its network namespace cannot be proven; not enrolled, retrying", "reason", reason, "error", err)
		a.events.Eventf(pod, corev1.EventTypeWarning, reason, "nftredir cannot capture the running pod's traffic: %v; retrying", err)
	} else {
		log.Debug("pod's network namespace still not proven; retrying", "reason", reason, "error", err, "retry_in", delay)
	}
	a.queue.AddAfter(uid, delay)
}

// settleDiscovery forgets that uid's namespace was not proven, unless a
// look for it (discover) ran since start: the pod was enrolled some
// other way, is no longer selected, or is gone.
func (a *Agent) settleDiscovery(uid string, start time.Time) {
	d := &a.disc
	d.mu.Lock()
	defer d.mu.Unlock()
	if u := d.unproven[uid]; u != nil && u.at.Before(start) {
		delete(d.unproven, uid)
	}
}

func (a *Agent) countDiscovery(outcome string) {
	a.disc.mu.Lock()
	a.disc.outcomes[outcome]++
	a.disc.mu.Unlock()
}

// noteScan counts sc once, however many pods it served.
func (a *Agent) noteScan(sc *pins.Scan) {
	d := &a.disc
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastScan != sc {
		d.lastScan = sc
		d.scans++
		d.scanSecs += sc.Took.Seconds()
	}
}

// podIPs is the pod's status.podIPs (status.podIP on old API servers).
func podIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && !containsAddr(out, ip) {
			out = append(out, ip.Unmap())
		}
	}
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 {
		add(pod.Status.PodIP)
	}
	return out
}

func containsAddr(s []netip.Addr, a netip.Addr) bool {
	for _, x := range s {
		if x == a.Unmap() {
			return true
		}
	}
	return false
}
