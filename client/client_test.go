package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/client/clienttest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

var errUnavailable = status.Error(codes.Unavailable, "daemon restarting")

func dial(t *testing.T, socket string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), socket, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func start(t *testing.T, opts ...client.Option) (*clienttest.Fake, *client.Client) {
	t.Helper()
	f := clienttest.New()
	srv := clienttest.Start(t, f)
	return f, dial(t, srv.Socket, opts...)
}

func addReq(uid string) *nftredirv1.AddPodRequest {
	return &nftredirv1.AddPodRequest{
		PodUid:       uid,
		PodName:      "web-" + uid,
		PodNamespace: "default",
		NetnsPath:    "/var/run/netns/" + uid,
		PodIps:       []string{"10.244.1.7"},
	}
}

func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("error %v: code %v, want %v", err, got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	_, c := start(t)
	ctx := t.Context()

	pod, err := c.AddPod(ctx, addReq("a"))
	if err != nil {
		t.Fatalf("AddPod: %v", err)
	}
	if pod.GetPodUid() != "a" || pod.GetOptions().GetCaptureMode() != nftredirv1.CaptureMode_CAPTURE_MODE_TPROXY {
		t.Errorf("AddPod returned %v, want the record with defaults filled in", pod)
	}
	got, err := c.GetPod(ctx, "a")
	if err != nil {
		t.Fatalf("GetPod: %v", err)
	}
	if !proto.Equal(got.GetPod(), pod) || got.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC {
		t.Errorf("GetPod = %v, want pod %v in sync", got, pod)
	}
	pods, err := c.ListPods(ctx)
	if err != nil || len(pods) != 1 || !proto.Equal(pods[0], pod) {
		t.Errorf("ListPods = %v, %v; want [%v]", pods, err, pod)
	}
	for i, want := range []bool{true, false} {
		existed, err := c.RemovePod(ctx, "a")
		if err != nil || existed != want {
			t.Errorf("RemovePod #%d = %v, %v; want %v, nil", i+1, existed, err, want)
		}
	}
	_, err = c.GetPod(ctx, "a")
	wantCode(t, err, codes.NotFound)
}

// RemovePod's options reach the daemon as the request's fields, and the
// precondition holds: a pod enrolled with another namespace stays.
func TestRemovePodOptions(t *testing.T) {
	f, c := start(t)
	ctx := t.Context()
	if _, err := c.AddPod(ctx, addReq("a")); err != nil {
		t.Fatal(err)
	}
	_, err := c.RemovePod(ctx, "a", client.IfNetns("/var/run/netns/older"), client.NamespaceTeardown())
	wantCode(t, err, codes.FailedPrecondition)
	if f.Pod("a") == nil {
		t.Fatal("a RemovePod refused for its netns_path released the pod")
	}
	existed, err := c.RemovePod(ctx, "a", client.IfNetns("/var/run/netns/a"), client.NamespaceTeardown())
	if err != nil || !existed || f.Pod("a") != nil {
		t.Errorf("RemovePod with the pod's netns_path = %v, %v; want it released", existed, err)
	}
	reqs := f.Requests()
	want := []*nftredirv1.RemovePodRequest{
		{PodUid: "a", NetnsPath: "/var/run/netns/older", NamespaceTeardown: true},
		{PodUid: "a", NetnsPath: "/var/run/netns/a", NamespaceTeardown: true},
	}
	if len(reqs) != 3 || !proto.Equal(reqs[1], want[0]) || !proto.Equal(reqs[2], want[1]) {
		t.Errorf("server got %v, want AddPod then %v", reqs, want)
	}
}

func TestRetriesUnavailable(t *testing.T) {
	f, c := start(t, client.WithRetry(5, time.Millisecond))
	f.Fail("AddPod", errUnavailable, errUnavailable)
	if _, err := c.AddPod(t.Context(), addReq("a")); err != nil {
		t.Fatalf("AddPod after two Unavailable: %v", err)
	}
	if n := f.Calls("AddPod"); n != 3 {
		t.Errorf("server saw %d AddPod calls, want 3", n)
	}
}

func TestRetryGivesUp(t *testing.T) {
	f, c := start(t, client.WithRetry(3, time.Millisecond))
	for range 10 {
		f.Fail("RemovePod", errUnavailable)
	}
	_, err := c.RemovePod(t.Context(), "a")
	wantCode(t, err, codes.Unavailable)
	if n := f.Calls("RemovePod"); n != 3 {
		t.Errorf("server saw %d RemovePod calls, want 3", n)
	}
}

func TestNoRetryOnOtherCodes(t *testing.T) {
	for _, code := range []codes.Code{codes.FailedPrecondition, codes.InvalidArgument, codes.Internal, codes.PermissionDenied} {
		t.Run(code.String(), func(t *testing.T) {
			f, c := start(t, client.WithRetry(5, time.Millisecond))
			f.Fail("AddPod", status.Error(code, "no"))
			_, err := c.AddPod(t.Context(), addReq("a"))
			wantCode(t, err, code)
			if n := f.Calls("AddPod"); n != 1 {
				t.Errorf("server saw %d AddPod calls, want 1", n)
			}
			if f.Pod("a") != nil {
				t.Error("the failed call was retried into success")
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	f, c := start(t, client.WithTimeout(100*time.Millisecond))
	f.Delay("ListPods", 10*time.Second)
	began := time.Now()
	_, err := c.ListPods(t.Context())
	wantCode(t, err, codes.DeadlineExceeded)
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("ListPods took %v with a 100ms timeout", d)
	}
}

func TestCallerDeadlineWins(t *testing.T) {
	f, c := start(t, client.WithTimeout(time.Minute))
	f.Delay("GetPod", 10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := c.GetPod(ctx, "a")
	wantCode(t, err, codes.DeadlineExceeded)
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("GetPod took %v with a 100ms deadline", d)
	}
}

// The timeout covers the whole call: a daemon that stays unavailable must
// not keep the caller waiting for every retry.
func TestTimeoutBoundsRetries(t *testing.T) {
	f, c := start(t, client.WithTimeout(200*time.Millisecond), client.WithRetry(1000, 20*time.Millisecond))
	for range 1000 {
		f.Fail("ListPods", errUnavailable)
	}
	began := time.Now()
	_, err := c.ListPods(t.Context())
	// The last real answer is more useful to an operator than the deadline.
	wantCode(t, err, codes.Unavailable)
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("ListPods took %v with a 200ms timeout", d)
	}
	if n := f.Calls("ListPods"); n >= 20 {
		t.Errorf("server saw %d calls in 200ms with backoff from 20ms", n)
	}
}

// A daemon restart leaves the socket unanswered for a moment; a call made in
// that moment must succeed once the daemon is back.
func TestRetryAcrossDaemonRestart(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nftredir.sock")
	f := clienttest.New()
	clienttest.StartAt(t, f, socket).Stop()

	c := dial(t, socket, client.WithRetry(10, 50*time.Millisecond))
	done := make(chan error, 1)
	go func() {
		_, err := c.AddPod(t.Context(), addReq("a"))
		done <- err
	}()
	time.Sleep(120 * time.Millisecond)
	clienttest.StartAt(t, f, socket)
	if err := <-done; err != nil {
		t.Fatalf("AddPod across restart: %v", err)
	}
	if f.Pod("a") == nil {
		t.Error("pod not recorded")
	}
}

func TestNoDaemon(t *testing.T) {
	c := dial(t, filepath.Join(t.TempDir(), "absent.sock"), client.WithRetry(2, time.Millisecond))
	_, err := c.ListPods(t.Context())
	wantCode(t, err, codes.Unavailable)
}

func TestDialEmptyPath(t *testing.T) {
	if _, err := client.Dial(t.Context(), ""); err == nil {
		t.Fatal("Dial with an empty path succeeded")
	}
}

func TestHealth(t *testing.T) {
	f, c := start(t, client.WithRetry(3, time.Millisecond))
	h, err := c.Health(t.Context())
	if err != nil || !h.Serving() {
		t.Fatalf("Health = %+v, %v; want serving", h, err)
	}

	f.Health.SetServingStatus(client.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	f.Fail("Check", errUnavailable)
	h, err = c.Health(t.Context())
	if err != nil {
		t.Fatalf("Health after one Unavailable: %v", err)
	}
	want := client.HealthStatus{Server: healthpb.HealthCheckResponse_SERVING, Service: healthpb.HealthCheckResponse_NOT_SERVING}
	if h != want || h.Serving() {
		t.Errorf("Health = %+v (serving %v), want %+v", h, h.Serving(), want)
	}
}

func recv(t *testing.T, w *client.Watch) *nftredirv1.WatchPodsResponse {
	t.Helper()
	ev, err := w.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return ev
}

func TestWatch(t *testing.T) {
	// A short timeout shows that it bounds the opening only.
	f, c := start(t, client.WithTimeout(100*time.Millisecond), client.WithRetry(3, time.Millisecond))
	ctx := t.Context()
	if _, err := c.AddPod(ctx, addReq("a")); err != nil {
		t.Fatal(err)
	}
	f.Fail("WatchPods", errUnavailable)
	w, err := c.WatchPods(ctx)
	if err != nil {
		t.Fatalf("WatchPods: %v", err)
	}
	if n := f.Calls("WatchPods"); n != 2 {
		t.Errorf("server saw %d WatchPods calls, want 2", n)
	}
	if ev := recv(t, w); ev.GetEvent() != nftredirv1.EventType_EVENT_TYPE_ADDED || ev.GetPod().GetPodUid() != "a" {
		t.Errorf("first event %v, want ADDED a", ev)
	}
	if ev := recv(t, w); ev.GetEvent() != nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE {
		t.Errorf("second event %v, want SNAPSHOT_DONE", ev)
	}

	time.Sleep(200 * time.Millisecond)
	if _, err := c.AddPod(ctx, addReq("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemovePod(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, w); ev.GetEvent() != nftredirv1.EventType_EVENT_TYPE_ADDED || ev.GetPod().GetPodUid() != "b" {
		t.Errorf("event %v, want ADDED b", ev)
	}
	if ev := recv(t, w); ev.GetEvent() != nftredirv1.EventType_EVENT_TYPE_REMOVED || ev.GetPod().GetPodUid() != "a" {
		t.Errorf("event %v, want REMOVED a", ev)
	}

	w.Close()
	_, err = w.Recv()
	wantCode(t, err, codes.Canceled)
}

func TestWatchOpenTimeout(t *testing.T) {
	f, c := start(t, client.WithTimeout(100*time.Millisecond))
	f.Delay("WatchPods", 10*time.Second)
	began := time.Now()
	_, err := c.WatchPods(t.Context())
	wantCode(t, err, codes.DeadlineExceeded)
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("WatchPods took %v to give up with a 100ms timeout", d)
	}
}

func TestWatchEndsWithContext(t *testing.T) {
	_, c := start(t)
	ctx, cancel := context.WithCancel(t.Context())
	w, err := c.WatchPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, w) // SNAPSHOT_DONE
	cancel()
	_, err = w.Recv()
	if status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
		t.Errorf("Recv after cancel: %v, want Canceled", err)
	}
}
