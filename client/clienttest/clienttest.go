// Package clienttest runs an in-memory RedirectService on a real Unix socket,
// for testing code that talks to nftredird (the client, nftredirctl, the CNI
// shim) without privileges or a kernel.
//
// The fake is a working model of the API contract, not a stub: it validates
// requests with the daemon's own validation (lifecycle.ValidateAddPod, the
// daemon's codes), keeps records, fills in the daemon's defaults, is
// idempotent, and
// streams watch events. It programs nothing and opens no namespace: every
// absolute path names a namespace, except the node's own (/proc/1/ns/net,
// /proc/self/ns/net and whatever ProtectNetns adds), which it refuses as
// the daemon does. The contract suite in package contract holds the fake
// and the real server to the same cases. Faults and delays can be injected
// per method to exercise callers' error handling.
package clienttest

import (
	"context"
	"fmt"
	"net"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// watchBuffer is how many events a slow watcher may lag behind before it is
// disconnected, as the real daemon does.
const watchBuffer = 64

// Fake is an in-memory RedirectService.
type Fake struct {
	nftredirv1.UnimplementedRedirectServiceServer

	// Health is the fake's health server; both "" and nftredirv1.ServiceName start
	// SERVING.
	Health *health.Server

	// Now stamps records; tests may replace it before serving.
	Now func() time.Time

	mu          sync.Mutex // protects the following fields
	pods        map[string]*nftredirv1.Pod
	protected   map[string]bool
	sync        map[string]*nftredirv1.GetPodResponse
	watchers    map[chan *nftredirv1.WatchPodsResponse]struct{}
	faults      map[string][]error
	delays      map[string]time.Duration
	calls       map[string]int
	requests    []proto.Message
	quarantined []*nftredirv1.QuarantinedRecord
}

// New returns an empty fake.
func New() *Fake {
	hs := health.NewServer()
	hs.SetServingStatus(nftredirv1.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return &Fake{
		Health:    hs,
		Now:       time.Now,
		pods:      map[string]*nftredirv1.Pod{},
		protected: map[string]bool{"/proc/1/ns/net": true, "/proc/self/ns/net": true},
		sync:      map[string]*nftredirv1.GetPodResponse{},
		watchers:  map[chan *nftredirv1.WatchPodsResponse]struct{}{},
		faults:    map[string][]error{},
		delays:    map[string]time.Duration{},
		calls:     map[string]int{},
	}
}

// ProtectNetns makes AddPod refuse path as the node's namespace, as the
// daemon refuses --node-netns and --protect-netns.
func (f *Fake) ProtectNetns(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.protected[path] = true
}

// Fail makes the next len(errs) calls of method (e.g. "AddPod", "Check")
// return errs in order, before doing anything.
func (f *Fake) Fail(method string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[method] = append(f.faults[method], errs...)
}

// Delay makes every later call of method wait d (or until its context ends)
// before being handled.
func (f *Fake) Delay(method string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delays[method] = d
}

// Calls reports how many calls of method reached the server, failed ones
// included.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Requests returns every request message received, oldest first.
func (f *Fake) Requests() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

// SetSync makes GetPod report the given live state for podUID instead of
// SYNC_STATUS_IN_SYNC with a canned ruleset.
func (f *Fake) SetSync(podUID string, st nftredirv1.SyncStatus, detail, liveRuleset string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sync[podUID] = &nftredirv1.GetPodResponse{SyncStatus: st, Detail: detail, LiveRuleset: liveRuleset}
}

// Pod returns the record of podUID, or nil.
func (f *Fake) Pod(podUID string) *nftredirv1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.pods[podUID]; ok {
		return proto.CloneOf(p)
	}
	return nil
}

// intercept applies injected faults and delays, and counts calls.
func (f *Fake) intercept(ctx context.Context, fullMethod string, req any) error {
	method := path.Base(fullMethod)
	f.mu.Lock()
	f.calls[method]++
	if m, ok := req.(proto.Message); ok {
		f.requests = append(f.requests, proto.Clone(m))
	}
	var err error
	if q := f.faults[method]; len(q) > 0 {
		err, f.faults[method] = q[0], q[1:]
	}
	d := f.delays[method]
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

func (f *Fake) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := f.intercept(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (f *Fake) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := f.intercept(ss.Context(), info.FullMethod, nil); err != nil {
		return err
	}
	return h(srv, ss)
}

// AddPod validates the request and records the pod with the daemon's
// defaults filled in, as the daemon does.
func (f *Fake) AddPod(_ context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	p, err := validateAdd(req)
	if err != nil {
		return nil, err
	}
	now := timestamppb.New(f.Now())
	p.NetnsId = fmt.Sprintf("4:%d", 4026530000+len(p.NetnsPath))
	p.EnrolledAt, p.UpdatedAt = now, now
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.protected[p.NetnsPath] {
		return nil, status.Errorf(codes.FailedPrecondition, "netns_path %s is the node's own network namespace; pods on the host network cannot be enrolled", p.NetnsPath)
	}
	for _, other := range f.pods {
		if other.PodUid != p.PodUid && other.NetnsPath == p.NetnsPath {
			return nil, status.Errorf(codes.FailedPrecondition, "netns_path %s is in use by pod %q; release it with RemovePod first", p.NetnsPath, other.PodUid)
		}
	}
	old, existed := f.pods[p.PodUid]
	if existed {
		// As the daemon: a re-apply keeps the enrolment time and stamps
		// the update; only a changed intent is an event.
		p.EnrolledAt = old.EnrolledAt
	}
	f.pods[p.PodUid] = p
	if !existed || !sameIntent(old, p) {
		f.notify(nftredirv1.EventType_EVENT_TYPE_ADDED, p)
	}
	return &nftredirv1.AddPodResponse{Pod: proto.CloneOf(p)}, nil
}

// sameIntent compares two records without their timestamps.
func sameIntent(a, b *nftredirv1.Pod) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.EnrolledAt, a.UpdatedAt, b.EnrolledAt, b.UpdatedAt = nil, nil, nil, nil
	return proto.Equal(a, b)
}

// DefaultOptions are the options of a pod that sets none, as the daemon
// echoes them with its default flags: every field explicit.
func DefaultOptions() *nftredirv1.RedirectOptions {
	return &nftredirv1.RedirectOptions{
		CaptureMode:    apimode.ToAPI(defaults.Mode),
		DnsCapture:     proto.Bool(defaults.CaptureDNS),
		Ipv6:           proto.Bool(defaults.IPv6),
		InboundCapture: proto.Bool(defaults.InboundCapture),
		TproxyIpv4:     proto.String(defaults.TProxyAddrV4().String()),
		TproxyIpv6:     proto.String(defaults.TProxyAddrV6().String()),
	}
}

// RemovePod forgets the pod; unknown pods are fine. A netns_path other
// than the record's is refused with FailedPrecondition and changes
// nothing. namespace_teardown releases the pod as a plain RemovePod does:
// the fake has no namespace to leave to its deletion, and does not model
// the daemon keeping the namespace the pod's until it is gone.
func (f *Fake) RemovePod(_ context.Context, req *nftredirv1.RemovePodRequest) (*nftredirv1.RemovePodResponse, error) {
	if err := validateRemove(req); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[req.GetPodUid()]
	if want := req.GetNetnsPath(); ok && want != "" && p.NetnsPath != want {
		return nil, status.Errorf(codes.FailedPrecondition, "pod %s is enrolled with netns_path %s, not %s; left as it is", p.PodUid, p.NetnsPath, want)
	}
	if ok {
		delete(f.pods, req.GetPodUid())
		delete(f.sync, req.GetPodUid())
		f.notify(nftredirv1.EventType_EVENT_TYPE_REMOVED, p)
	}
	return &nftredirv1.RemovePodResponse{Existed: ok}, nil
}

// GetPod returns the record and the live state set by SetSync.
func (f *Fake) GetPod(_ context.Context, req *nftredirv1.GetPodRequest) (*nftredirv1.GetPodResponse, error) {
	if err := validateUID(req.GetPodUid()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[req.GetPodUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pod %s is not enrolled", req.GetPodUid())
	}
	resp := &nftredirv1.GetPodResponse{
		SyncStatus:  nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC,
		LiveRuleset: "table inet nftredir {\n\tcomment \"" + p.PodUid + "\"\n}\n",
	}
	if s, ok := f.sync[p.PodUid]; ok {
		resp = proto.CloneOf(s)
	}
	resp.Pod = proto.CloneOf(p)
	return resp, nil
}

// ListPods returns the records in the documented order.
func (f *Fake) ListPods(context.Context, *nftredirv1.ListPodsRequest) (*nftredirv1.ListPodsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &nftredirv1.ListPodsResponse{Pods: f.sorted()}
	for _, q := range f.quarantined {
		resp.Quarantined = append(resp.Quarantined, proto.CloneOf(q))
	}
	return resp, nil
}

// SetQuarantined makes ListPods report these quarantined records.
func (f *Fake) SetQuarantined(recs ...*nftredirv1.QuarantinedRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.quarantined = recs
}

func (f *Fake) sorted() []*nftredirv1.Pod {
	pods := make([]*nftredirv1.Pod, 0, len(f.pods))
	for _, p := range f.pods {
		pods = append(pods, proto.CloneOf(p))
	}
	slices.SortFunc(pods, func(a, b *nftredirv1.Pod) int {
		if c := strings.Compare(a.PodNamespace, b.PodNamespace); c != 0 {
			return c
		}
		if c := strings.Compare(a.PodName, b.PodName); c != 0 {
			return c
		}
		return strings.Compare(a.PodUid, b.PodUid)
	})
	return pods
}

// WatchPods sends the snapshot, SNAPSHOT_DONE, then changes.
func (f *Fake) WatchPods(_ *nftredirv1.WatchPodsRequest, ss grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse]) error {
	ch := make(chan *nftredirv1.WatchPodsResponse, watchBuffer)
	f.mu.Lock()
	snapshot := f.sorted()
	// Subscribing under the same lock as the snapshot means no change falls
	// between the two.
	f.watchers[ch] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.watchers, ch)
		f.mu.Unlock()
	}()
	for _, p := range snapshot {
		if err := ss.Send(&nftredirv1.WatchPodsResponse{Event: nftredirv1.EventType_EVENT_TYPE_ADDED, Pod: p}); err != nil {
			return err
		}
	}
	if err := ss.Send(&nftredirv1.WatchPodsResponse{Event: nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE}); err != nil {
		return err
	}
	for {
		select {
		case <-ss.Context().Done():
			return status.FromContextError(ss.Context().Err()).Err()
		case ev, ok := <-ch:
			if !ok {
				return status.Error(codes.ResourceExhausted, "watcher fell too far behind; watch again")
			}
			if err := ss.Send(ev); err != nil {
				return err
			}
		}
	}
}

// notify is called with f.mu held.
func (f *Fake) notify(ev nftredirv1.EventType, p *nftredirv1.Pod) {
	for ch := range f.watchers {
		select {
		case ch <- &nftredirv1.WatchPodsResponse{Event: ev, Pod: proto.CloneOf(p)}:
		default:
			close(ch)
			delete(f.watchers, ch)
		}
	}
}

// Server is a fake serving on a Unix socket.
type Server struct {
	Socket string
	Fake   *Fake
	grpc   *grpc.Server
}

// Start serves f on a fresh socket in t.TempDir until the test ends.
func Start(t testing.TB, f *Fake) *Server {
	t.Helper()
	return StartAt(t, f, filepath.Join(t.TempDir(), "nftredir.sock"))
}

// StartAt serves f on socket, which must not exist yet, until the test ends
// or Stop is called. Tests of reconnecting use it to bring a daemon back on
// the same path.
func StartAt(t testing.TB, f *Fake, socket string) *Server {
	t.Helper()
	// sun_path holds 108 bytes; a longer path would fail with a confusing
	// EINVAL.
	if len(socket) >= 108 {
		t.Fatalf("socket path %q too long for a Unix socket", socket)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := &Server{
		Socket: socket,
		Fake:   f,
		grpc: grpc.NewServer(
			grpc.ChainUnaryInterceptor(f.unary),
			grpc.ChainStreamInterceptor(f.stream),
		),
	}
	nftredirv1.RegisterRedirectServiceServer(s.grpc, f)
	healthpb.RegisterHealthServer(s.grpc, f.Health)
	go func() { _ = s.grpc.Serve(lis) }()
	t.Cleanup(s.Stop)
	return s
}

// Stop stops serving at once, ending open streams, and removes the socket.
func (s *Server) Stop() {
	s.grpc.Stop()
}
