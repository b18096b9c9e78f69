package rpc

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/client/clienttest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// These tests hold the client to grpc-go's server (the fake daemon in
// clienttest is a real grpc.Server on a real Unix socket) and to the
// generated code: what it sends is what grpc-go decodes, what it reads is
// what the full client reads.

func start(t *testing.T, opts ...Option) (*clienttest.Fake, *clienttest.Server, *Client) {
	t.Helper()
	f := clienttest.New()
	srv := clienttest.Start(t, f)
	c, err := New(srv.Socket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return f, srv, c
}

func full(t *testing.T, socket string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), socket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestSameConstantsAsGRPCAndClient(t *testing.T) {
	for c := OK; c <= Unauthenticated; c++ {
		if g := codes.Code(c); g.String() != c.String() {
			t.Errorf("code %d: %q here, %q in grpc-go", c, c, g)
		}
	}
	if DefaultSocket != client.DefaultSocket || ServiceName != client.ServiceName {
		t.Errorf("DefaultSocket %q, ServiceName %q; client has %q, %q", DefaultSocket, ServiceName, client.DefaultSocket, client.ServiceName)
	}
	for v, name := range nftredirv1.CaptureMode_name {
		if got := CaptureMode(v).String(); got != name {
			t.Errorf("CaptureMode %d: %q, want %q", v, got, name)
		}
	}
	for v, name := range nftredirv1.SyncStatus_name {
		if got := SyncStatus(v).String(); got != name {
			t.Errorf("SyncStatus %d: %q, want %q", v, got, name)
		}
	}
	for v, name := range healthpb.HealthCheckResponse_ServingStatus_name {
		if got := ServingStatus(v).String(); got != name {
			t.Errorf("ServingStatus %d: %q, want %q", v, got, name)
		}
	}
}

func boolp(b bool) *bool { return &b }

// What AddPod sends is, field for field, the generated message: the
// server decodes it to the request the plugin meant.
func TestAddPodRequestAsGenerated(t *testing.T) {
	for name, tc := range map[string]struct {
		req  *AddPodRequest
		want *nftredirv1.AddPodRequest
	}{
		"minimal": {
			&AddPodRequest{PodUID: "u1", NetnsPath: "/run/netns/a"},
			&nftredirv1.AddPodRequest{PodUid: "u1", NetnsPath: "/run/netns/a"},
		},
		"every field": {
			&AddPodRequest{PodUID: "u2", PodName: "web-0", PodNamespace: "shop", NetnsPath: "/run/netns/b",
				PodIPs: []string{"10.0.0.7", "fd00::7"},
				Options: &Options{CaptureMode: CaptureModeREDIRECT, ExcludeInboundPorts: []uint32{15021, 1, 65535},
					ExcludeOutboundPorts: []uint32{53}, ExcludeOutboundCIDRs: []string{"10.0.0.0/8", "fd00::/8"},
					DNSCapture: boolp(false), IPv6: boolp(true), InboundCapture: boolp(false),
					RerouteVirtualInterfaces: []string{"k6t-eth0", "tap0"}}},
			&nftredirv1.AddPodRequest{PodUid: "u2", PodName: "web-0", PodNamespace: "shop", NetnsPath: "/run/netns/b",
				PodIps: []string{"10.0.0.7", "fd00::7"},
				Options: &nftredirv1.RedirectOptions{CaptureMode: nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
					ExcludeInboundPorts: []uint32{15021, 1, 65535}, ExcludeOutboundPorts: []uint32{53},
					ExcludeOutboundCidrs: []string{"10.0.0.0/8", "fd00::/8"},
					DnsCapture:           proto.Bool(false), Ipv6: proto.Bool(true), InboundCapture: proto.Bool(false),
					RerouteVirtualInterfaces: []string{"k6t-eth0", "tap0"}}},
		},
		"empty options": {
			&AddPodRequest{PodUID: "u3", NetnsPath: "/run/netns/c", Options: &Options{}},
			&nftredirv1.AddPodRequest{PodUid: "u3", NetnsPath: "/run/netns/c", Options: &nftredirv1.RedirectOptions{}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, _, c := start(t)
			resp, err := c.AddPod(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			reqs := f.Requests()
			if len(reqs) != 1 || !proto.Equal(reqs[0], tc.want) {
				t.Fatalf("server got %v, want %v", reqs, tc.want)
			}
			rec := f.Pod(tc.want.PodUid)
			want := &Pod{PodUID: rec.PodUid, PodName: rec.PodName, PodNamespace: rec.PodNamespace, NetnsPath: rec.NetnsPath,
				NetnsID: rec.NetnsId, PodIPs: rec.PodIps, CaptureMode: CaptureMode(rec.GetOptions().GetCaptureMode())}
			if resp.NotCapturedReason != "" || fmt.Sprint(resp.Pod) != fmt.Sprint(want) {
				t.Errorf("response %+v, want pod %+v", resp, want)
			}
		})
	}
}

// What RemovePod sends is the generated message: byte for byte what the
// generated code marshals, and what the server decodes.
func TestRemovePodRequestAsGenerated(t *testing.T) {
	for name, tc := range map[string]struct {
		req  *RemovePodRequest
		want *nftredirv1.RemovePodRequest
	}{
		"uid only":     {&RemovePodRequest{PodUID: "u1"}, &nftredirv1.RemovePodRequest{PodUid: "u1"}},
		"precondition": {&RemovePodRequest{PodUID: "u2", NetnsPath: "/run/netns/b"}, &nftredirv1.RemovePodRequest{PodUid: "u2", NetnsPath: "/run/netns/b"}},
		"teardown":     {&RemovePodRequest{PodUID: "u3", NamespaceTeardown: true}, &nftredirv1.RemovePodRequest{PodUid: "u3", NamespaceTeardown: true}},
		"both, as a CNI DEL": {&RemovePodRequest{PodUID: "u4", NetnsPath: "/var/run/netns/cni-1234", NamespaceTeardown: true},
			&nftredirv1.RemovePodRequest{PodUid: "u4", NetnsPath: "/var/run/netns/cni-1234", NamespaceTeardown: true}},
		"empty": {&RemovePodRequest{}, &nftredirv1.RemovePodRequest{}},
	} {
		t.Run(name, func(t *testing.T) {
			gen, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.req.marshal(); !slices.Equal(got, gen) {
				t.Errorf("marshal = % x, generated code % x", got, gen)
			}
			var back nftredirv1.RemovePodRequest
			if err := proto.Unmarshal(tc.req.marshal(), &back); err != nil || !proto.Equal(&back, tc.want) {
				t.Errorf("decoded as %v, %v; want %v", &back, err, tc.want)
			}
			f, _, c := start(t)
			_, err = c.RemovePod(t.Context(), tc.req)
			if want := map[bool]Code{true: InvalidArgument, false: OK}[tc.want.PodUid == ""]; CodeOf(err) != want {
				t.Errorf("RemovePod: %v, want code %s", err, want)
			}
			if reqs := f.Requests(); len(reqs) != 1 || !proto.Equal(reqs[0], tc.want) {
				t.Errorf("server got %v, want %v", reqs, tc.want)
			}
		})
	}
}

// Responses are decoded as the generated code decodes them, whatever
// fields the daemon adds that the plugin does not read.
func TestDecodeAsGenerated(t *testing.T) {
	now := timestamppb.New(time.Unix(1700000000, 5))
	pod := &nftredirv1.Pod{PodUid: "u", PodName: "n", PodNamespace: "ns", NetnsPath: "/p", NetnsId: "4:1:2",
		PodIps: []string{"10.1.1.1", "fd00::1"}, ServiceAccount: proto.String("sa"), EnrolledAt: now, UpdatedAt: now,
		ZdsState: proto.String("acked"),
		Options: &nftredirv1.RedirectOptions{CaptureMode: nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
			ExcludeInboundPorts: []uint32{1, 2}, DnsCapture: proto.Bool(true), TproxyIpv4: proto.String("127.0.0.1")}}
	want := &Pod{PodUID: "u", PodName: "n", PodNamespace: "ns", NetnsPath: "/p", NetnsID: "4:1:2",
		PodIPs: []string{"10.1.1.1", "fd00::1"}, CaptureMode: CaptureModeREDIRECT}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	add, err := unmarshalAddPodResponse(marshal(&nftredirv1.AddPodResponse{Pod: pod}))
	if err != nil || fmt.Sprint(add.Pod) != fmt.Sprint(want) {
		t.Errorf("AddPodResponse: %+v, %v; want pod %+v", add, err, want)
	}
	add, err = unmarshalAddPodResponse(marshal(&nftredirv1.AddPodResponse{NotCapturedReason: "namespace not labelled"}))
	if err != nil || add.Pod != nil || add.NotCapturedReason != "namespace not labelled" {
		t.Errorf("AddPodResponse not captured: %+v, %v", add, err)
	}
	get, err := unmarshalGetPodResponse(marshal(&nftredirv1.GetPodResponse{Pod: pod,
		SyncStatus: nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED, Detail: "rule 3 differs", LiveRuleset: "table inet nftredir {}"}))
	if err != nil || fmt.Sprint(get.Pod) != fmt.Sprint(want) || get.SyncStatus != SyncDrifted || get.Detail != "rule 3 differs" {
		t.Errorf("GetPodResponse: %+v, %v", get, err)
	}
	pods, err := unmarshalListPodsResponse(marshal(&nftredirv1.ListPodsResponse{Pods: []*nftredirv1.Pod{pod, {PodUid: "v"}},
		Quarantined: []*nftredirv1.QuarantinedRecord{{File: "x", PodUid: "q"}}}))
	if err != nil || len(pods) != 2 || fmt.Sprint(pods[0]) != fmt.Sprint(want) || pods[1].PodUID != "v" {
		t.Errorf("ListPodsResponse: %v, %v", pods, err)
	}
	// Unpacked repeated and negative enums are valid protobuf too.
	if p, err := unmarshalPod(marshal(&nftredirv1.Pod{Options: &nftredirv1.RedirectOptions{CaptureMode: -1}})); err != nil || p.CaptureMode != -1 {
		t.Errorf("negative enum: %+v, %v", p, err)
	}
	// Truncated and corrupted input fails cleanly, never panics.
	whole := marshal(&nftredirv1.ListPodsResponse{Pods: []*nftredirv1.Pod{pod, pod}})
	for i := range whole {
		_, _ = unmarshalListPodsResponse(whole[:i])
		mangled := slices.Clone(whole)
		mangled[i] ^= 0xff
		_, _ = unmarshalListPodsResponse(mangled)
	}
	for _, bad := range [][]byte{{0x0a}, {0x0a, 0x05, 'a'}, {0x08}, {0x0b}, {0x00}, {0x09, 1, 2}} {
		if _, err := unmarshalListPodsResponse(bad); CodeOf(err) != Internal {
			t.Errorf("malformed % x: %v, want Internal", bad, err)
		}
	}
}

// Every call reads what the full client reads, and more than a frame and
// a flow-control window's worth of response comes through whole.
func TestCallsAgreeWithFullClient(t *testing.T) {
	f, srv, c := start(t)
	ref := full(t, srv.Socket)
	ctx := t.Context()
	const n = 3000 // ListPods of about 400 KB
	for i := range n {
		if _, err := f.AddPod(ctx, &nftredirv1.AddPodRequest{PodUid: fmt.Sprintf("pod-%04d", i), PodName: fmt.Sprintf("web-%d", i),
			PodNamespace: "shop", NetnsPath: fmt.Sprintf("/run/netns/pod-%d", i), PodIps: []string{"10.2.3.4", "fd00::1234"}}); err != nil {
			t.Fatal(err)
		}
	}
	want, err := ref.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("ListPods: %d pods, full client %d", len(got), len(want))
	}
	for i := range want {
		w := want[i]
		if g := got[i]; g.PodUID != w.PodUid || g.NetnsPath != w.NetnsPath || g.NetnsID != w.NetnsId || !slices.Equal(g.PodIPs, w.PodIps) ||
			g.CaptureMode != CaptureMode(w.GetOptions().GetCaptureMode()) {
			t.Fatalf("pod %d: %+v, full client %v", i, g, w)
		}
	}

	f.SetSync("pod-0007", nftredirv1.SyncStatus_SYNC_STATUS_ABSENT, "table missing", "")
	gp, err := c.GetPod(ctx, "pod-0007")
	wp, werr := ref.GetPod(ctx, "pod-0007")
	if err != nil || werr != nil || gp.SyncStatus != SyncStatus(wp.GetSyncStatus()) || gp.Detail != wp.GetDetail() || gp.Pod.NetnsPath != wp.GetPod().GetNetnsPath() {
		t.Errorf("GetPod: %+v, %v; full client %v, %v", gp, err, wp, werr)
	}
	_, err = c.GetPod(ctx, "nobody")
	_, werr = ref.GetPod(ctx, "nobody")
	if CodeOf(err) != NotFound || MessageOf(err) != status.Convert(werr).Message() {
		t.Errorf("GetPod of an unknown pod: %v; full client %v", err, werr)
	}

	for _, wantExisted := range []bool{true, false} {
		existed, err := c.RemovePod(ctx, &RemovePodRequest{PodUID: "pod-0001"})
		if err != nil || existed != wantExisted {
			t.Errorf("RemovePod: %v, %v; want existed %v", existed, err, wantExisted)
		}
	}

	h, err := c.Health(ctx)
	if err != nil || !h.Serving() {
		t.Errorf("Health: %+v, %v", h, err)
	}
	f.Health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	h, err = c.Health(ctx)
	wh, werr := ref.Health(ctx)
	if err != nil || werr != nil || h.Serving() || h.Server != ServingStatus(wh.Server) || h.Service != ServingStatus(wh.Service) {
		t.Errorf("Health NOT_SERVING: %+v, %v; full client %+v, %v", h, err, wh, werr)
	}
}

// A request larger than the server's flow-control window is sent as the
// window opens. No valid request is that large, so the daemon's answer is
// a refusal; that it counts every entry shows the whole request arrived.
func TestLargeRequest(t *testing.T) {
	_, _, c := start(t)
	var ips []string
	for i := range 4000 { // about 160 KB
		ips = append(ips, fmt.Sprintf("fd00:1234:5678:9abc:def0:%04x:%04x:1", i, i))
	}
	_, err := c.AddPod(t.Context(), &AddPodRequest{PodUID: "big", NetnsPath: "/run/netns/big", PodIPs: ips})
	if CodeOf(err) != Code(codes.InvalidArgument) || !strings.Contains(MessageOf(err), "pod_ips has 4000 entries") {
		t.Errorf("AddPod of 4000 pod IPs: %v; want the refusal that counted all of them", err)
	}
}

// Every status the daemon returns arrives with its code and its message,
// however the message had to be encoded.
func TestStatusCodesAndMessages(t *testing.T) {
	f, srv, c := start(t, WithRetry(1, 0))
	ref := full(t, srv.Socket, client.WithRetry(1, 0))
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		msg := fmt.Sprintf("daemon says %s: 100%% sure, ünïcode\nand a second line", code)
		f.Fail("AddPod", status.Error(code, msg), status.Error(code, msg))
		_, err := c.AddPod(t.Context(), &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"})
		_, werr := ref.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: "u", NetnsPath: "/run/netns/u"})
		if CodeOf(err) != Code(code) || MessageOf(err) != msg {
			t.Errorf("%s: got %v", code, err)
		}
		if status.Code(werr) != code || status.Convert(werr).Message() != msg {
			t.Errorf("%s: the full client got %v", code, werr)
		}
	}
	// The server's own refusals: an unknown method.
	_, err := c.call(t.Context(), "/nftredir.v1.RedirectService/NoSuchMethod", nil)
	if CodeOf(err) != Unimplemented {
		t.Errorf("unknown method: %v, want Unimplemented", err)
	}
	// And the connection still serves after all of them.
	if _, err := c.AddPod(t.Context(), &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"}); err != nil {
		t.Errorf("AddPod after the failures: %v", err)
	}
}

// Unavailable is retried, on a new connection, until the daemon answers.
func TestRetriesUnavailable(t *testing.T) {
	f, _, c := start(t)
	f.Fail("AddPod", status.Error(codes.Unavailable, "starting"), status.Error(codes.Unavailable, "starting"))
	if _, err := c.AddPod(t.Context(), &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"}); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls("AddPod"); n != 3 {
		t.Errorf("AddPod reached the server %d times, want 3", n)
	}
	// Other codes are not retried.
	f.Fail("RemovePod", status.Error(codes.Internal, "boom"))
	if _, err := c.RemovePod(t.Context(), &RemovePodRequest{PodUID: "u"}); CodeOf(err) != Internal {
		t.Errorf("RemovePod: %v, want Internal", err)
	}
	if n := f.Calls("RemovePod"); n != 1 {
		t.Errorf("RemovePod reached the server %d times, want 1", n)
	}
}

// A daemon that restarts between two calls, or while the client waits for
// it, is reached on its new socket.
func TestDaemonRestart(t *testing.T) {
	f, srv, c := start(t)
	ctx := t.Context()
	if _, err := c.ListPods(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if _, err := c.ListPods(ctx); CodeOf(err) != Unavailable {
		// With the socket gone every try fails; the retries take ~750ms.
		t.Fatalf("ListPods with the daemon stopped: %v, want Unavailable", err)
	}
	back := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() {
		clienttest.StartAt(t, f, srv.Socket)
		close(back)
	})
	if _, err := c.AddPod(ctx, &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"}); err != nil {
		t.Fatalf("AddPod while the daemon comes back: %v", err)
	}
	<-back
	if f.Pod("u") == nil {
		t.Error("pod not enrolled")
	}
}

func TestNoDaemon(t *testing.T) {
	c, err := New(filepath.Join(t.TempDir(), "missing.sock"), WithRetry(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AddPod(t.Context(), &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"})
	if CodeOf(err) != Unavailable || !strings.Contains(MessageOf(err), "no such file") {
		t.Errorf("got %v, want Unavailable naming the missing socket", err)
	}
}

// The timeout reaches the daemon as the call's deadline, and the client
// gives up at it with DeadlineExceeded; a cancelled call is Canceled. The
// next call works.
func TestDeadlineAndCancel(t *testing.T) {
	f, _, c := start(t, WithTimeout(300*time.Millisecond))
	f.Delay("AddPod", time.Minute)
	t0 := time.Now()
	_, err := c.AddPod(t.Context(), &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"})
	if CodeOf(err) != DeadlineExceeded || time.Since(t0) > 3*time.Second {
		t.Errorf("got %v after %s, want DeadlineExceeded after about 300ms", err, time.Since(t0))
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err = c.AddPod(ctx, &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"}); CodeOf(err) != Canceled {
		t.Errorf("cancelled: %v, want Canceled", err)
	}
	f.Delay("AddPod", 0)
	if _, err := c.AddPod(t.Context(), &AddPodRequest{PodUID: "u", NetnsPath: "/run/netns/u"}); err != nil {
		t.Errorf("AddPod after the timeout: %v", err)
	}
}

func TestGRPCTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "1u", 1500 * time.Nanosecond: "2u", 10 * time.Second: "10000000u",
		200 * time.Second: "200000m", 300 * time.Hour: "1080000S",
	} {
		if got := grpcTimeout(d); got != want {
			t.Errorf("grpcTimeout(%s) = %s, want %s", d, got, want)
		}
	}
}
