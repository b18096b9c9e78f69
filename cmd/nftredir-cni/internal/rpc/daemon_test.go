package rpc

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/server"
	"github.com/nftredir/nftredir/state"
)

// startDaemon serves the daemon's own API (package server over lifecycle
// and the kernel capture engine, as nftredird composes them in standalone
// mode) on a Unix socket in a temp dir. Its node is a namespace the test
// made, so the machine's own namespace is never programmed.
func startDaemon(t *testing.T) (socket, node string) {
	t.Helper()
	nstest.RequirePrivileged(t)
	n := nstest.NewNetns(t)
	guard, err := netns.NewGuard(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, "pods"), nil)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := lifecycle.New(lifecycle.Config{Engine: capture.NewKernel(guard, nft.NewNetlink()), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Pods: pods, ReconcileInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	socket = filepath.Join(dir, "nftredir.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis, 2*time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server Run: %v", err)
		}
	})
	return socket, n.Path
}

// sameStatus requires the client's failure to carry the code and message
// the generated client got for the same request.
func sameStatus(t *testing.T, what string, err, ref error, want Code) {
	t.Helper()
	st := status.Convert(ref)
	if CodeOf(err) != want || Code(st.Code()) != want || MessageOf(err) != st.Message() {
		t.Errorf("%s: %v; the generated client got %v; want code %s from both, same message", what, err, ref, want)
	}
}

// samePod requires the client's reading of a pod to be the generated
// client's, field for field.
func samePod(t *testing.T, what string, got *Pod, ref *nftredirv1.Pod) {
	t.Helper()
	if got == nil || ref == nil || got.PodUID != ref.PodUid || got.PodName != ref.PodName || got.PodNamespace != ref.PodNamespace ||
		got.NetnsPath != ref.NetnsPath || got.NetnsID != ref.NetnsId || !slices.Equal(got.PodIPs, ref.PodIps) ||
		got.CaptureMode != CaptureMode(ref.GetOptions().GetCaptureMode()) {
		t.Errorf("%s: %+v; the generated client read %v", what, got, ref)
	}
}

// TestAgainstDaemon is the client's contract with the daemon: every call
// the plugin makes (AddPod, RemovePod, GetPod, ListPods, health Check),
// with every field it sends, against the daemon's own server, each answer
// read as the generated client reads it, refusals with the same code and
// message. What the daemon recorded of each AddPod is read back with the
// generated client, so a field the daemon did not get as meant shows.
func TestAgainstDaemon(t *testing.T) {
	socket, node := startDaemon(t)
	c, err := New(socket, WithRetry(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ref := full(t, socket, client.WithRetry(1, 0))
	ctx := t.Context()

	deadline := time.Now().Add(10 * time.Second)
	for {
		h, err := c.Health(ctx)
		if err == nil && h.Serving() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not serving after 10s: %+v, %v", h, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	h, err := c.Health(ctx)
	rh, rerr := ref.Health(ctx)
	if err != nil || rerr != nil || h.Server != ServingStatus(rh.Server) || h.Service != ServingStatus(rh.Service) {
		t.Errorf("Health: %+v, %v; generated client %+v, %v", h, err, rh, rerr)
	}

	// AddPod with every field and option the plugin sends.
	pod1 := nstest.NewNetns(t)
	every := &AddPodRequest{
		PodUID: "c0a7e5d1-rpc-1", PodName: "web-0", PodNamespace: "shop", NetnsPath: pod1.Path,
		PodIPs: []string{"10.250.0.7", "fd00:250::7", "10.250.0.7"},
		Options: &Options{
			CaptureMode: CaptureModeREDIRECT, ExcludeInboundPorts: []uint32{15021, 8080}, ExcludeOutboundPorts: []uint32{5432},
			ExcludeOutboundCIDRs: []string{"169.254.169.254", "10.96.0.0/12"}, DNSCapture: boolp(true), IPv6: boolp(false),
			InboundCapture: boolp(true), RerouteVirtualInterfaces: []string{"tap0", "k6t-eth0", "tap0"},
		},
	}
	resp, err := c.AddPod(ctx, every)
	if err != nil {
		t.Fatalf("AddPod: %v", err)
	}
	rec, err := ref.GetPod(ctx, every.PodUID)
	if err != nil {
		t.Fatal(err)
	}
	samePod(t, "AddPod's pod", resp.Pod, rec.GetPod())
	if resp.NotCapturedReason != "" || rec.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("AddPod: not captured %q, sync %s", resp.NotCapturedReason, rec.GetSyncStatus())
	}
	// What the daemon made of it: the same options, normalised.
	o := rec.GetPod().GetOptions()
	wantOpts := &nftredirv1.RedirectOptions{
		CaptureMode: nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT, ExcludeInboundPorts: []uint32{8080, 15021},
		ExcludeOutboundPorts: []uint32{5432}, ExcludeOutboundCidrs: []string{"10.96.0.0/12", "169.254.169.254/32"},
		DnsCapture: proto.Bool(true), Ipv6: proto.Bool(false), InboundCapture: proto.Bool(true),
		TproxyIpv4: o.TproxyIpv4, TproxyIpv6: o.TproxyIpv6, // the daemon's defaults; the plugin sends none
		RerouteVirtualInterfaces: []string{"k6t-eth0", "tap0"},
	}
	if !proto.Equal(o, wantOpts) {
		t.Errorf("recorded options %v\nwant %v", o, wantOpts)
	}
	if rec.GetPod().GetPodName() != "web-0" || rec.GetPod().GetPodNamespace() != "shop" || !slices.Equal(rec.GetPod().GetPodIps(), []string{"10.250.0.7", "fd00:250::7"}) {
		t.Errorf("recorded identity %v", rec.GetPod())
	}
	ruleset := pod1.Nft(t, "list", "ruleset")
	if !strings.Contains(ruleset, `"k6t-eth0"`) || !strings.Contains(ruleset, `"tap0"`) {
		t.Errorf("the pod's ruleset does not name the rerouted interfaces:\n%s", ruleset)
	}

	// Again: a re-apply, the same answer.
	again, err := c.AddPod(ctx, every)
	if err != nil {
		t.Fatalf("AddPod again: %v", err)
	}
	samePod(t, "AddPod again", again.Pod, rec.GetPod())

	// A second pod with no options at all: the daemon's defaults.
	pod2 := nstest.NewNetns(t)
	plain := &AddPodRequest{PodUID: "c0a7e5d1-rpc-2", NetnsPath: pod2.Path}
	resp2, err := c.AddPod(ctx, plain)
	if err != nil {
		t.Fatalf("AddPod with daemon defaults: %v", err)
	}
	rec2, err := ref.GetPod(ctx, plain.PodUID)
	if err != nil {
		t.Fatal(err)
	}
	samePod(t, "AddPod with daemon defaults", resp2.Pod, rec2.GetPod())

	// Refusals: the same code and message as the generated client gets.
	asGenerated := func(r *AddPodRequest) *nftredirv1.AddPodRequest {
		var m nftredirv1.AddPodRequest
		if err := proto.Unmarshal(r.marshal(), &m); err != nil {
			t.Fatal(err)
		}
		return &m
	}
	for _, bad := range []struct {
		name string
		req  *AddPodRequest
		code Code
	}{
		{"rerouting loopback", &AddPodRequest{PodUID: "c0a7e5d1-rpc-3", NetnsPath: nstest.NewNetns(t).Path,
			Options: &Options{RerouteVirtualInterfaces: []string{"lo"}}}, InvalidArgument},
		{"a bad uid", &AddPodRequest{PodUID: "a b", NetnsPath: pod2.Path}, InvalidArgument},
		{"the node's namespace", &AddPodRequest{PodUID: "c0a7e5d1-rpc-4", NetnsPath: node}, FailedPrecondition},
		{"another pod's namespace", &AddPodRequest{PodUID: "c0a7e5d1-rpc-5", NetnsPath: pod1.Path}, FailedPrecondition},
	} {
		_, err := c.AddPod(ctx, bad.req)
		_, rerr := ref.AddPodResponse(ctx, asGenerated(bad.req))
		sameStatus(t, "AddPod of "+bad.name, err, rerr, bad.code)
	}

	// GetPod, in sync and not: the status and detail as the generated
	// client reads them.
	pod2.Nft(t, "flush", "ruleset")
	for _, uid := range []string{every.PodUID, plain.PodUID} {
		got, err := c.GetPod(ctx, uid)
		want, rerr := ref.GetPod(ctx, uid)
		if err != nil || rerr != nil {
			t.Fatalf("GetPod %s: %v; generated client %v", uid, err, rerr)
		}
		samePod(t, "GetPod "+uid, got.Pod, want.GetPod())
		if got.SyncStatus != SyncStatus(want.GetSyncStatus()) || got.Detail != want.GetDetail() {
			t.Errorf("GetPod %s: %s %q; generated client %s %q", uid, got.SyncStatus, got.Detail, want.GetSyncStatus(), want.GetDetail())
		}
	}
	if got, _ := c.GetPod(ctx, plain.PodUID); got == nil || got.SyncStatus == SyncInSync {
		t.Errorf("GetPod after the pod's table was flushed: %+v; want it out of sync", got)
	}
	_, err = c.GetPod(ctx, "c0a7e5d1-nobody")
	_, rerr = ref.GetPod(ctx, "c0a7e5d1-nobody")
	sameStatus(t, "GetPod of a pod not enrolled", err, rerr, NotFound)

	// ListPods: both pods, in the daemon's order.
	list, err := c.ListPods(ctx)
	rlist, rerr := ref.ListPods(ctx)
	if err != nil || rerr != nil || len(list) != 2 || len(rlist) != 2 {
		t.Fatalf("ListPods: %d pods, %v; generated client %d, %v", len(list), err, len(rlist), rerr)
	}
	for i := range list {
		samePod(t, "ListPods", list[i], rlist[i])
	}

	// RemovePod as the plugin's DEL and GC send it.
	_, err = c.RemovePod(ctx, &RemovePodRequest{PodUID: every.PodUID, NetnsPath: pod2.Path, NamespaceTeardown: true})
	_, rerr = ref.RemovePod(ctx, every.PodUID, client.IfNetns(pod2.Path), client.NamespaceTeardown())
	sameStatus(t, "RemovePod naming another namespace", err, rerr, FailedPrecondition)
	existed, err := c.RemovePod(ctx, &RemovePodRequest{PodUID: every.PodUID, NetnsPath: pod1.Path, NamespaceTeardown: true})
	if err != nil || !existed {
		t.Errorf("RemovePod (DEL): existed %v, %v; want true", existed, err)
	}
	existed, err = c.RemovePod(ctx, &RemovePodRequest{PodUID: every.PodUID, NetnsPath: pod1.Path, NamespaceTeardown: true})
	if err != nil || existed {
		t.Errorf("RemovePod (DEL) again: existed %v, %v; want false", existed, err)
	}
	existed, err = c.RemovePod(ctx, &RemovePodRequest{PodUID: plain.PodUID, NetnsPath: pod2.Path})
	if err != nil || !existed {
		t.Errorf("RemovePod (GC): existed %v, %v; want true", existed, err)
	}
	if out := pod2.Nft(t, "list", "ruleset"); strings.Contains(out, "table") {
		t.Errorf("RemovePod without namespace_teardown left:\n%s", out)
	}
	if list, err := c.ListPods(ctx); err != nil || len(list) != 0 {
		t.Errorf("ListPods after removing both: %v, %v", list, err)
	}
}
