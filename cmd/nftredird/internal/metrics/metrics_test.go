package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/zds"
)

func TestInterceptorCountsByCode(t *testing.T) {
	m := New(nil)
	ic := m.UnaryInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/nftredir.v1.RedirectService/AddPod"}
	ok := func(context.Context, any) (any, error) { return "r", nil }
	bad := func(context.Context, any) (any, error) { return nil, status.Error(codes.InvalidArgument, "no") }
	for _, h := range []grpc.UnaryHandler{ok, ok, bad} {
		ic(context.Background(), nil, info, h)
	}
	if got := testutil.ToFloat64(m.handled.WithLabelValues("nftredir.v1.RedirectService", "AddPod", "OK")); got != 2 {
		t.Errorf("OK calls %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.handled.WithLabelValues("nftredir.v1.RedirectService", "AddPod", "InvalidArgument")); got != 1 {
		t.Errorf("InvalidArgument calls %v, want 1", got)
	}
}

func TestScrapeTimeSources(t *testing.T) {
	m := New(nil)
	pods := 0
	m.SetSources(Sources{
		EnrolledPods:   func() (int, error) { return pods, nil },
		ZDS:            func() zds.Stats { return zds.Stats{Connected: 1, Acks: 7, Nacks: 2} },
		ProbeAddresses: func() int { return 4 },
		ProbeRepairs:   func() int64 { return 2 },
	})
	pods = 3
	const want = `
# HELP nftredir_pods_enrolled Pods enrolled: records in the state directory.
# TYPE nftredir_pods_enrolled gauge
nftredir_pods_enrolled 3
# HELP nftredir_probe_table_addresses Pod addresses in the node probe table's sets.
# TYPE nftredir_probe_table_addresses gauge
nftredir_probe_table_addresses 4
# HELP nftredir_probe_table_repairs_total Times the node probe table (table, sets, chain or an enrolled pod's address) was found changed by someone else and restored.
# TYPE nftredir_probe_table_repairs_total counter
nftredir_probe_table_repairs_total 2
# HELP nftredir_zds_acks_total ZDS messages the node proxy acknowledged.
# TYPE nftredir_zds_acks_total counter
nftredir_zds_acks_total 7
# HELP nftredir_zds_nacks_total ZDS messages the node proxy refused (nack).
# TYPE nftredir_zds_nacks_total counter
nftredir_zds_nacks_total 2
# HELP nftredir_zds_proxies_connected Node proxies connected over ZDS and past their hello.
# TYPE nftredir_zds_proxies_connected gauge
nftredir_zds_proxies_connected 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"nftredir_pods_enrolled", "nftredir_probe_table_addresses", "nftredir_probe_table_repairs_total", "nftredir_zds_acks_total", "nftredir_zds_nacks_total", "nftredir_zds_proxies_connected"); err != nil {
		t.Error(err)
	}
	m.ObserveReconcile(lifecycle.ReconcileResult{InSync: 5, Repaired: 2}, 0)
	if got := testutil.ToFloat64(m.driftRepairs); got != 2 {
		t.Errorf("drift repairs %v, want 2", got)
	}
	// Without sources the metrics are left out, not reported as zero.
	if n, err := testutil.GatherAndCount(New(nil).Registry(), "nftredir_pods_enrolled", "nftredir_zds_acks_total"); err != nil || n != 0 {
		t.Errorf("without sources: %d series (%v), want none", n, err)
	}
}

func TestSplitMethod(t *testing.T) {
	for in, want := range map[string][2]string{
		"/nftredir.v1.RedirectService/AddPod": {"nftredir.v1.RedirectService", "AddPod"},
		"/grpc.health.v1.Health/Check":        {"grpc.health.v1.Health", "Check"},
		"odd":                                 {"unknown", "odd"},
	} {
		if s, m := splitMethod(in); s != want[0] || m != want[1] {
			t.Errorf("splitMethod(%q) = %q, %q", in, s, m)
		}
	}
}

func TestDiscoverySource(t *testing.T) {
	m := New(nil)
	m.SetSources(Sources{Discovery: func() Discovery {
		return Discovery{Outcomes: map[string]uint64{"proven": 3, "ambiguous": 1}, Unproven: 1, Scans: 2, ScanSeconds: 0.07}
	}})
	const want = `
# HELP nftredir_kube_netns_discoveries_total Running pods whose network namespace Kubernetes mode looked for among the runtime's pins, by outcome: proven (one namespace carries the pod's IP), not_found, ambiguous (several do; refused), no_pod_ip, scan_failed.
# TYPE nftredir_kube_netns_discoveries_total counter
nftredir_kube_netns_discoveries_total{outcome="ambiguous"} 1
nftredir_kube_netns_discoveries_total{outcome="proven"} 3
# HELP nftredir_kube_pods_netns_unproven Pods the enrolment policy selects that are not enrolled because their network namespace could not be proven; retried.
# TYPE nftredir_kube_pods_netns_unproven gauge
nftredir_kube_pods_netns_unproven 1
# HELP nftredir_kube_pin_scans_total Scans of the runtime's network namespace pins.
# TYPE nftredir_kube_pin_scans_total counter
nftredir_kube_pin_scans_total 2
# HELP nftredir_kube_pin_scan_seconds_total Time spent scanning the runtime's network namespace pins.
# TYPE nftredir_kube_pin_scan_seconds_total counter
nftredir_kube_pin_scan_seconds_total 0.07
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"nftredir_kube_netns_discoveries_total", "nftredir_kube_pods_netns_unproven", "nftredir_kube_pin_scans_total", "nftredir_kube_pin_scan_seconds_total"); err != nil {
		t.Error(err)
	}
}
