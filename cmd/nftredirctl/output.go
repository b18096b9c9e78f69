package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// podName is how people know a pod: namespace/name, else its UID.
func podName(p *nftredirv1.Pod) string {
	switch {
	case p.GetPodName() != "" && p.GetPodNamespace() != "":
		return p.GetPodNamespace() + "/" + p.GetPodName()
	case p.GetPodName() != "":
		return p.GetPodName()
	}
	return p.GetPodUid()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func list[T any](items []T) string {
	if len(items) == 0 {
		return "-"
	}
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = fmt.Sprint(it)
	}
	return strings.Join(s, ",")
}

// onOff shows an optional bool; unset only happens with a daemon that did
// not fill in its defaults.
func onOff(b *bool) string {
	switch {
	case b == nil:
		return "default"
	case *b:
		return "on"
	}
	return "off"
}

var syncNames = map[nftredirv1.SyncStatus]string{
	nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC:     "in sync",
	nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED:     "drifted (the live rules differ from the record)",
	nftredirv1.SyncStatus_SYNC_STATUS_NETNS_GONE:  "netns gone (the pod's namespace no longer exists)",
	nftredirv1.SyncStatus_SYNC_STATUS_ABSENT:      "absent (the pod's table is missing from its namespace)",
	nftredirv1.SyncStatus_SYNC_STATUS_QUARANTINED: "quarantined (the record is corrupt; capture may remain until the pod is removed)",
}

func syncName(s nftredirv1.SyncStatus) string {
	if n, ok := syncNames[s]; ok {
		return n
	}
	return s.String()
}

// age is kubectl's style: the largest unit only, because a table row needs
// a glance, not a timestamp.
func age(now time.Time, ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	d := now.Sub(ts.AsTime())
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func (a *app) when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", ts.AsTime().UTC().Format(time.RFC3339), age(a.now(), ts))
}

// printPod adds a record to t as "Field: value" rows, so that callers can
// add their own rows in the same alignment before flushing.
func (a *app) printPod(t *tabwriter.Writer, p *nftredirv1.Pod) {
	o := p.GetOptions()
	fmt.Fprintf(t, "Pod:\t%s\n", podName(p))
	fmt.Fprintf(t, "UID:\t%s\n", p.GetPodUid())
	fmt.Fprintf(t, "Netns:\t%s (id %s)\n", p.GetNetnsPath(), dash(p.GetNetnsId()))
	fmt.Fprintf(t, "IPs:\t%s\n", list(p.GetPodIps()))
	if p.ServiceAccount != nil {
		fmt.Fprintf(t, "Service account:\t%s\n", p.GetServiceAccount())
	}
	if p.ZdsState != nil {
		fmt.Fprintf(t, "ZDS state:\t%s\n", p.GetZdsState())
	}
	fmt.Fprintf(t, "Capture mode:\t%s\n", modeName(o.GetCaptureMode()))
	fmt.Fprintf(t, "Inbound capture:\t%s\n", onOff(o.InboundCapture))
	fmt.Fprintf(t, "DNS capture:\t%s\n", onOff(o.DnsCapture))
	fmt.Fprintf(t, "IPv6 capture:\t%s\n", onOff(o.Ipv6))
	fmt.Fprintf(t, "Excluded inbound ports:\t%s\n", list(o.GetExcludeInboundPorts()))
	fmt.Fprintf(t, "Excluded outbound ports:\t%s\n", list(o.GetExcludeOutboundPorts()))
	fmt.Fprintf(t, "Excluded outbound CIDRs:\t%s\n", list(o.GetExcludeOutboundCidrs()))
	if ifs := o.GetRerouteVirtualInterfaces(); len(ifs) > 0 {
		fmt.Fprintf(t, "Rerouted interfaces:\t%s\n", list(ifs))
	}
	fmt.Fprintf(t, "Enrolled:\t%s\n", a.when(p.GetEnrolledAt()))
	fmt.Fprintf(t, "Updated:\t%s\n", a.when(p.GetUpdatedAt()))
}

// printTable shows pods one per row, in the daemon's order. The ZDS
// column appears only when the daemon serves ZDS, so a table without it
// reads the same as before ZDS existed.
func (a *app) printTable(w io.Writer, pods []*nftredirv1.Pod) error {
	withZDS := slices.ContainsFunc(pods, func(p *nftredirv1.Pod) bool { return p.ZdsState != nil })
	t := newTable(w)
	if withZDS {
		fmt.Fprintln(t, "NAMESPACE\tNAME\tPOD UID\tNETNS\tIPS\tMODE\tZDS\tAGE")
	} else {
		fmt.Fprintln(t, "NAMESPACE\tNAME\tPOD UID\tNETNS\tIPS\tMODE\tAGE")
	}
	now := a.now()
	for _, p := range pods {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t",
			dash(p.GetPodNamespace()), dash(p.GetPodName()), p.GetPodUid(), p.GetNetnsPath(),
			list(p.GetPodIps()), modeName(p.GetOptions().GetCaptureMode()))
		if withZDS {
			fmt.Fprintf(t, "%s\t", dash(p.GetZdsState()))
		}
		fmt.Fprintf(t, "%s\n", age(now, p.GetEnrolledAt()))
	}
	return t.Flush()
}

// printQuarantined lists corrupt records whose pods may still be
// captured, after the pods; nothing when there are none.
func printQuarantined(w io.Writer, recs []*nftredirv1.QuarantinedRecord) error {
	if len(recs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%d quarantined record(s): corrupt, the pod's capture may remain; remove the pod to release it.\n", len(recs))
	t := newTable(w)
	fmt.Fprintln(t, "POD UID\tNETNS\tFILE\tREASON")
	for _, q := range recs {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\n", dash(q.GetPodUid()), dash(q.GetNetnsPath()), q.GetFile(), q.GetReason())
	}
	return t.Flush()
}

// printEvent prints one watch event as a line, stamped with when it arrived.
func (a *app) printEvent(w io.Writer, ev *nftredirv1.WatchPodsResponse) {
	ts := a.now().Format("15:04:05")
	kind := strings.TrimPrefix(ev.GetEvent().String(), "EVENT_TYPE_")
	if ev.GetEvent() == nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE {
		fmt.Fprintf(w, "%s %-13s (the pods above are all the enrolled pods; changes follow)\n", ts, kind)
		return
	}
	p := ev.GetPod()
	fmt.Fprintf(w, "%s %-13s %s uid=%s netns=%s ips=%s\n", ts, kind, podName(p), p.GetPodUid(), p.GetNetnsPath(), list(p.GetPodIps()))
}
