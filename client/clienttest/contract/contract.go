// Package contract is the API contract of nftredir.v1.RedirectService as
// test cases, run against any implementation: the daemon's server and
// the clienttest fake both pass it, so the fake that callers' tests run
// against cannot drift from the daemon unnoticed.
//
// The cases cover what the fake can model without a kernel: validation
// and its codes, idempotence, the defaults echoed in records, ordering,
// and namespace ownership by path. A path that names no namespace is the
// kernel's to judge (the fake accepts every absolute path), so it is not
// a case here; the server's own tests cover it.
package contract

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/client/clienttest"
	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Target is one fresh, empty service under test.
type Target struct {
	API nftredirv1.RedirectServiceClient
	// NewNetns returns the path of a namespace a pod can be enrolled in,
	// a different one on each call.
	NewNetns func(t *testing.T) string
	// NodeNetns is a path the service must refuse as the node's own
	// namespace.
	NodeNetns string
}

// Run runs every case against a target made by start, a fresh one per
// case.
func Run(t *testing.T, start func(t *testing.T) Target) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, start(t)) })
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, tg Target)
}{
	{"AddPod new echoes the defaults", addNew},
	{"AddPod again is a re-apply", addAgain},
	{"AddPod options are normalised", addOptions},
	{"AddPod invalid pod uid", addInvalidUID},
	{"AddPod invalid netns path", addInvalidPath},
	{"AddPod node namespace", addNodeNetns},
	{"AddPod bad options", addBadOptions},
	{"AddPod namespace of another pod", addNetnsInUse},
	{"RemovePod", remove},
	{"RemovePod netns_path of another namespace", removeOtherNetns},
	{"RemovePod netns_path of the pod's namespace", removeSameNetns},
	{"RemovePod netns_path of a pod not enrolled", removeNetnsNotEnrolled},
	{"RemovePod namespace_teardown", removeTeardown},
	{"RemovePod bad netns_path", removeBadNetns},
	{"GetPod", get},
	{"ListPods order", list},
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (code %s), want code %s", what, err, got, want)
	}
}

func mustAdd(t *testing.T, tg Target, req *nftredirv1.AddPodRequest) *nftredirv1.Pod {
	t.Helper()
	resp, err := tg.API.AddPod(ctx(t), req)
	if err != nil {
		t.Fatalf("AddPod %s: %v", req.GetPodUid(), err)
	}
	return resp.GetPod()
}

// wantEmpty checks that refused requests changed nothing.
func wantEmpty(t *testing.T, tg Target) {
	t.Helper()
	resp, err := tg.API.ListPods(ctx(t), &nftredirv1.ListPodsRequest{})
	if err != nil {
		t.Fatalf("ListPods: %v", err)
	}
	if len(resp.GetPods()) != 0 {
		t.Errorf("refused requests left pods behind: %v", resp.GetPods())
	}
}

func addNew(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	pod := mustAdd(t, tg, &nftredirv1.AddPodRequest{
		PodUid: "0b6f3c1e-new", PodName: "web-1", PodNamespace: "shop", NetnsPath: path,
		PodIps: []string{"10.244.1.8", "fd00:244::7", "10.244.1.7", "10.244.1.8"},
	})
	if pod.GetPodUid() != "0b6f3c1e-new" || pod.GetPodName() != "web-1" || pod.GetPodNamespace() != "shop" || pod.GetNetnsPath() != path {
		t.Errorf("identity not echoed: %v", pod)
	}
	if pod.GetNetnsId() == "" {
		t.Error("no netns id")
	}
	if want := []string{"10.244.1.7", "10.244.1.8", "fd00:244::7"}; !equal(pod.GetPodIps(), want) {
		t.Errorf("pod ips %q, want sorted and deduplicated %q", pod.GetPodIps(), want)
	}
	// The defaults as package defaults states them, which is what the
	// daemon's flags default to.
	if !proto.Equal(pod.GetOptions(), clienttest.DefaultOptions()) {
		t.Errorf("options\n got %v\nwant %v", pod.GetOptions(), clienttest.DefaultOptions())
	}
	if pod.GetOptions().GetDnsCapture() != defaults.CaptureDNS || pod.GetOptions().GetIpv6() != defaults.IPv6 {
		t.Errorf("options %v disagree with package defaults", pod.GetOptions())
	}
	if !pod.GetEnrolledAt().IsValid() || !proto.Equal(pod.GetEnrolledAt(), pod.GetUpdatedAt()) {
		t.Errorf("enrolled %v, updated %v: want both set and equal", pod.GetEnrolledAt(), pod.GetUpdatedAt())
	}
}

func addAgain(t *testing.T, tg Target) {
	req := &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-again", PodName: "a", PodNamespace: "ns", NetnsPath: tg.NewNetns(t)}
	first := mustAdd(t, tg, req)
	second := mustAdd(t, tg, req)
	if !proto.Equal(first.GetEnrolledAt(), second.GetEnrolledAt()) {
		t.Errorf("re-apply moved the enrolment time: %v then %v", first.GetEnrolledAt(), second.GetEnrolledAt())
	}
	if second.GetUpdatedAt().AsTime().Before(first.GetUpdatedAt().AsTime()) {
		t.Errorf("update time went back: %v then %v", first.GetUpdatedAt(), second.GetUpdatedAt())
	}
	a, b := proto.CloneOf(first), proto.CloneOf(second)
	a.UpdatedAt, b.UpdatedAt = nil, nil
	if !proto.Equal(a, b) {
		t.Errorf("re-apply changed the record:\n%v\n%v", first, second)
	}
	resp, err := tg.API.ListPods(ctx(t), &nftredirv1.ListPodsRequest{})
	if err != nil || len(resp.GetPods()) != 1 {
		t.Errorf("ListPods after two adds: %v, %v; want one pod", resp.GetPods(), err)
	}
}

func addOptions(t *testing.T, tg Target) {
	pod := mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-opts", NetnsPath: tg.NewNetns(t), Options: &nftredirv1.RedirectOptions{
		CaptureMode:          nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
		ExcludeInboundPorts:  []uint32{8080, 22, 22},
		ExcludeOutboundPorts: []uint32{443},
		ExcludeOutboundCidrs: []string{"169.254.169.254", "10.1.0.0/16", "fd00::/8", "10.1.0.0/16"},
		DnsCapture:           proto.Bool(!defaults.CaptureDNS),
		TproxyIpv4:           proto.String(""),
	}})
	want := clienttest.DefaultOptions()
	want.CaptureMode = nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT
	want.ExcludeInboundPorts = []uint32{22, 8080}
	want.ExcludeOutboundPorts = []uint32{443}
	want.ExcludeOutboundCidrs = []string{"10.1.0.0/16", "169.254.169.254/32", "fd00::/8"}
	want.DnsCapture = proto.Bool(!defaults.CaptureDNS)
	want.TproxyIpv4 = proto.String("")
	if !proto.Equal(pod.GetOptions(), want) {
		t.Errorf("options\n got %v\nwant %v", pod.GetOptions(), want)
	}
}

func addInvalidUID(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	for _, uid := range []string{"", "a/b", "a b", `a"b`, "a\nb", "a\u200bb", strings.Repeat("u", defaults.MaxPodUIDLen+1)} {
		_, err := tg.API.AddPod(ctx(t), &nftredirv1.AddPodRequest{PodUid: uid, NetnsPath: path})
		wantCode(t, fmt.Sprintf("AddPod uid %q", uid), err, codes.InvalidArgument)
	}
	wantEmpty(t, tg)
}

func addInvalidPath(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	for _, p := range []string{"", "run/netns/x", path + "/", path + "/../" + path[strings.LastIndex(path, "/")+1:], "/run/netns/a\nb", "/" + strings.Repeat("p", 4096)} {
		_, err := tg.API.AddPod(ctx(t), &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-path", NetnsPath: p})
		wantCode(t, "AddPod netns path "+p, err, codes.InvalidArgument)
	}
	wantEmpty(t, tg)
}

func addNodeNetns(t *testing.T, tg Target) {
	for _, p := range []string{tg.NodeNetns, "/proc/1/ns/net", "/proc/self/ns/net"} {
		_, err := tg.API.AddPod(ctx(t), &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-node", NetnsPath: p})
		wantCode(t, "AddPod netns path "+p, err, codes.FailedPrecondition)
	}
	wantEmpty(t, tg)
}

func addBadOptions(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	for name, req := range map[string]*nftredirv1.AddPodRequest{
		"port 0":               {Options: &nftredirv1.RedirectOptions{ExcludeInboundPorts: []uint32{0}}},
		"port 70000":           {Options: &nftredirv1.RedirectOptions{ExcludeOutboundPorts: []uint32{70000}}},
		"too many ports":       {Options: &nftredirv1.RedirectOptions{ExcludeInboundPorts: seq(65)}},
		"cidr with host bits":  {Options: &nftredirv1.RedirectOptions{ExcludeOutboundCidrs: []string{"10.1.2.3/8"}}},
		"not a cidr":           {Options: &nftredirv1.RedirectOptions{ExcludeOutboundCidrs: []string{"ten/8"}}},
		"v6 cidr with v6 off":  {Options: &nftredirv1.RedirectOptions{Ipv6: proto.Bool(false), ExcludeOutboundCidrs: []string{"fd00::/8"}}},
		"unknown capture mode": {Options: &nftredirv1.RedirectOptions{CaptureMode: 99}},
		"v6 tproxy_ipv4":       {Options: &nftredirv1.RedirectOptions{TproxyIpv4: proto.String("::1")}},
		"unspecified tproxy":   {Options: &nftredirv1.RedirectOptions{TproxyIpv6: proto.String("::")}},
		"pod ip with prefix":   {PodIps: []string{"10.0.0.1/24"}},
		"loopback pod ip":      {PodIps: []string{"127.0.0.1"}},
		"too many pod ips":     {PodIps: ips(17)},
		"pod name too long":    {PodName: strings.Repeat("n", 254)},
		"namespace with tab":   {PodNamespace: "a\tb"},
	} {
		req.PodUid, req.NetnsPath = "0b6f3c1e-bad", path
		_, err := tg.API.AddPod(ctx(t), req)
		wantCode(t, "AddPod "+name, err, codes.InvalidArgument)
	}
	wantEmpty(t, tg)
}

func addNetnsInUse(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-first", NetnsPath: path})
	_, err := tg.API.AddPod(ctx(t), &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-second", NetnsPath: path})
	wantCode(t, "AddPod of a second pod in the namespace", err, codes.FailedPrecondition)
	if _, err := tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-second"}); status.Code(err) != codes.NotFound {
		t.Errorf("the refused pod was recorded: %v", err)
	}
	if _, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "0b6f3c1e-first"}); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-second", NetnsPath: path})
}

func remove(t *testing.T, tg Target) {
	mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-rm", NetnsPath: tg.NewNetns(t)})
	for i, want := range []bool{true, false} {
		resp, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "0b6f3c1e-rm"})
		if err != nil || resp.GetExisted() != want {
			t.Errorf("RemovePod #%d: existed %v, %v; want existed %v", i+1, resp.GetExisted(), err, want)
		}
	}
	resp, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "never-enrolled"})
	if err != nil || resp.GetExisted() {
		t.Errorf("RemovePod of an unknown pod: existed %v, %v; want success, not existed", resp.GetExisted(), err)
	}
	_, err = tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "a/b"})
	wantCode(t, "RemovePod of an invalid uid", err, codes.InvalidArgument)
	_, err = tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-rm"})
	wantCode(t, "GetPod after RemovePod", err, codes.NotFound)
	wantEmpty(t, tg)
}

// A sandbox's teardown cannot release the pod's newer sandbox: the pod
// stays enrolled as it was, teardown hint or not.
func removeOtherNetns(t *testing.T, tg Target) {
	added := mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-moved", NetnsPath: tg.NewNetns(t)})
	older := tg.NewNetns(t)
	for _, teardown := range []bool{false, true} {
		_, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "0b6f3c1e-moved", NetnsPath: older, NamespaceTeardown: teardown})
		wantCode(t, fmt.Sprintf("RemovePod with another netns_path (teardown %v)", teardown), err, codes.FailedPrecondition)
	}
	resp, err := tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-moved"})
	if err != nil || !proto.Equal(resp.GetPod(), added) {
		t.Fatalf("after refused RemovePods: %v, %v; want the pod as AddPod recorded it %v", resp.GetPod(), err, added)
	}
	if resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("sync status %s (%s) after refused RemovePods, want IN_SYNC", resp.GetSyncStatus(), resp.GetDetail())
	}
}

func removeSameNetns(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-same", NetnsPath: path})
	resp, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "0b6f3c1e-same", NetnsPath: path})
	if err != nil || !resp.GetExisted() {
		t.Fatalf("RemovePod with the pod's netns_path: existed %v, %v; want released", resp.GetExisted(), err)
	}
	_, err = tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-same"})
	wantCode(t, "GetPod after RemovePod", err, codes.NotFound)
	wantEmpty(t, tg)
}

// The precondition is on an enrolment; with none there is nothing it
// could protect, and RemovePod stays idempotent.
func removeNetnsNotEnrolled(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	for _, teardown := range []bool{false, true} {
		resp, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "never-enrolled", NetnsPath: path, NamespaceTeardown: teardown})
		if err != nil || resp.GetExisted() {
			t.Errorf("RemovePod of an unknown pod with a netns_path (teardown %v): existed %v, %v; want success, not existed", teardown, resp.GetExisted(), err)
		}
	}
}

// A netns_path AddPod would refuse is refused here too, and releases
// nothing.
func removeBadNetns(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-bad", NetnsPath: path})
	for _, bad := range []string{"relative/ns", path + "/", "/var/run/netns/a\x00b"} {
		_, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "0b6f3c1e-bad", NetnsPath: bad, NamespaceTeardown: true})
		wantCode(t, fmt.Sprintf("RemovePod with netns_path %q", bad), err, codes.InvalidArgument)
	}
	if _, err := tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-bad"}); err != nil {
		t.Errorf("GetPod after refused RemovePods: %v; want the pod still enrolled", err)
	}
}

// namespace_teardown releases the pod at once: the caller deletes the
// namespace next, so the pod is gone from every answer when the call
// returns, and a repeated teardown (a runtime's second DEL) finds nothing.
func removeTeardown(t *testing.T, tg Target) {
	path := tg.NewNetns(t)
	mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-down", NetnsPath: path})
	for i, want := range []bool{true, false} {
		resp, err := tg.API.RemovePod(ctx(t), &nftredirv1.RemovePodRequest{PodUid: "0b6f3c1e-down", NetnsPath: path, NamespaceTeardown: true})
		if err != nil || resp.GetExisted() != want {
			t.Errorf("RemovePod with namespace_teardown #%d: existed %v, %v; want existed %v", i+1, resp.GetExisted(), err, want)
		}
	}
	_, err := tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-down"})
	wantCode(t, "GetPod after a teardown RemovePod", err, codes.NotFound)
	wantEmpty(t, tg)
}

func get(t *testing.T, tg Target) {
	_, err := tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "never-enrolled"})
	wantCode(t, "GetPod of an unknown pod", err, codes.NotFound)
	for _, uid := range []string{"", "a b"} {
		_, err = tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: uid})
		wantCode(t, "GetPod of uid "+uid, err, codes.InvalidArgument)
	}
	added := mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: "0b6f3c1e-get", PodName: "g", PodNamespace: "ns", NetnsPath: tg.NewNetns(t)})
	resp, err := tg.API.GetPod(ctx(t), &nftredirv1.GetPodRequest{PodUid: "0b6f3c1e-get"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp.GetPod(), added) {
		t.Errorf("GetPod record\n got %v\nwant what AddPod returned %v", resp.GetPod(), added)
	}
	if resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("sync status %s (%s), want IN_SYNC", resp.GetSyncStatus(), resp.GetDetail())
	}
	if !strings.Contains(resp.GetLiveRuleset(), "table inet nftredir") {
		t.Errorf("live ruleset does not show the table:\n%s", resp.GetLiveRuleset())
	}
}

func list(t *testing.T, tg Target) {
	for _, p := range []struct{ uid, ns, name string }{
		{"u3", "b", "x"}, {"u1", "a", "z"}, {"u2", "b", "x"}, {"u4", "a", "y"},
	} {
		mustAdd(t, tg, &nftredirv1.AddPodRequest{PodUid: p.uid, PodNamespace: p.ns, PodName: p.name, NetnsPath: tg.NewNetns(t)})
	}
	resp, err := tg.API.ListPods(ctx(t), &nftredirv1.ListPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range resp.GetPods() {
		got = append(got, p.GetPodUid())
	}
	// By namespace, then name, then uid.
	if want := []string{"u4", "u1", "u2", "u3"}; !equal(got, want) {
		t.Errorf("ListPods order %q, want %q", got, want)
	}
	if len(resp.GetQuarantined()) != 0 {
		t.Errorf("quarantined records in a fresh service: %v", resp.GetQuarantined())
	}
}

func equal(a, b []string) bool { return slices.Equal(a, b) }

func seq(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(1000 + i)
	}
	return out
}

func ips(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.0.%d", i+1)
	}
	return out
}
