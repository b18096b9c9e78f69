// Package client is the Go client of nftredird's gRPC API, for node proxies,
// nftredirctl and the other tools. (nftredir-cni, exec'd for every pod,
// has a smaller client of its own: cmd/nftredir-cni/internal/rpc.)
//
// Every error a method returns is a gRPC status error (use status.Code), so
// callers can tell a request to fix (InvalidArgument, FailedPrecondition)
// from a fault worth retrying later (Unavailable).
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/retry"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// DefaultSocket is where nftredird listens unless told otherwise.
const DefaultSocket = defaults.Socket

// ServiceName is the RedirectService's full name, which is also its
// grpc.health.v1 service name.
const ServiceName = nftredirv1.ServiceName

// Option configures a Client.
type Option func(*config)

type config struct {
	timeout  time.Duration
	retry    retry.Schedule
	dialOpts []grpc.DialOption
}

// WithTimeout bounds every unary call, retries included, unless the caller's
// context has an earlier deadline. Zero leaves calls bounded only by the
// caller's context. The default is 10s. WatchPods is not bounded: it is
// meant to run until cancelled.
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// WithRetry sets how often a call that failed with Unavailable is tried in
// all (1 disables retries) and the first pause between tries, which doubles
// up to defaults.CallMaxBackoff. The default is defaults.CallAttempts
// tries from defaults.CallBackoff, which rides out a daemon restart.
//
// Retrying is safe for every RPC because every RPC of the API is idempotent;
// Unavailable is the only code retried, because it is the only one that
// says the same call may succeed unchanged.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *config) {
		c.retry.Attempts = max(attempts, 1)
		c.retry.Backoff = backoff
	}
}

// WithDialOptions adds gRPC dial options, e.g. interceptors.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) { c.dialOpts = append(c.dialOpts, opts...) }
}

// Client talks to one nftredird. It is safe for concurrent use.
type Client struct {
	cfg    config
	conn   *grpc.ClientConn
	rpc    nftredirv1.RedirectServiceClient
	health healthpb.HealthClient
}

// Dial prepares a client for the daemon listening on socketPath. It does not
// wait for the daemon: the connection is made on the first call and re-made
// after the daemon restarts, so a client may outlive many daemons. ctx is
// not retained.
func Dial(ctx context.Context, socketPath string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if socketPath == "" {
		return nil, errors.New("dial: empty socket path")
	}
	abs, err := filepath.Abs(socketPath)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socketPath, err)
	}
	cfg := config{timeout: defaults.CallTimeout, retry: retry.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	// Plain text is right here: the socket never leaves the node, and the
	// daemon authorises callers by their SO_PEERCRED uid/gid.
	dialOpts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, cfg.dialOpts...)
	conn, err := grpc.NewClient("unix://"+abs, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", abs, err)
	}
	return &Client{
		cfg:    cfg,
		conn:   conn,
		rpc:    nftredirv1.NewRedirectServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
	}, nil
}

// Connect starts connecting to the daemon now instead of on the first
// call, so that the handshake overlaps the caller's own work. It does not
// wait; a daemon that is not there is reported by the first call.
func (c *Client) Connect() {
	c.conn.Connect()
}

// Close releases the connection. Calls in flight fail with Canceled.
func (c *Client) Close() error {
	return c.conn.Close()
}

// AddPod enrols a pod, or re-applies its rules when its options, IPs or
// namespace changed, and returns the pod as the daemon recorded it: nil
// when the daemon's enrolment policy (Kubernetes mode) left it
// uncaptured; AddPodResponse says why.
func (c *Client) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.Pod, error) {
	resp, err := c.AddPodResponse(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetPod(), nil
}

// AddPodResponse is AddPod with the daemon's whole answer, including the
// reason a pod was left uncaptured.
func (c *Client) AddPodResponse(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	return call(ctx, c, func(ctx context.Context) (*nftredirv1.AddPodResponse, error) {
		return c.rpc.AddPod(ctx, req)
	})
}

// RemovePod releases a pod. It succeeds when the pod is not enrolled or its
// namespace is gone; existed tells whether there was anything to release.
// Options set the request's optional fields: IfNetns, NamespaceTeardown.
func (c *Client) RemovePod(ctx context.Context, podUID string, opts ...RemoveOption) (existed bool, err error) {
	req := &nftredirv1.RemovePodRequest{PodUid: podUID}
	for _, o := range opts {
		o(req)
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*nftredirv1.RemovePodResponse, error) {
		return c.rpc.RemovePod(ctx, req)
	})
	if err != nil {
		return false, err
	}
	return resp.GetExisted(), nil
}

// RemoveOption sets an optional field of a RemovePod request.
type RemoveOption func(*nftredirv1.RemovePodRequest)

// IfNetns releases the pod only if it is enrolled with the namespace at
// path (netns_path). If a newer sandbox of the pod enrolled it with
// another namespace since, nothing changes and RemovePod fails with
// FailedPrecondition; a pod that is not enrolled is still a success. A
// caller tearing down one sandbox of a pod uses it so as never to release
// the pod's next one.
func IfNetns(path string) RemoveOption {
	return func(r *nftredirv1.RemovePodRequest) { r.NetnsPath = path }
}

// NamespaceTeardown tells the daemon that the caller deletes the pod's
// namespace right after (namespace_teardown), as a container runtime does
// after CNI DEL: the pod is released at once, and its table and routing
// are left to go with the namespace rather than removed first (which
// would only make the namespace's deletion wait for the kernel). The
// daemon removes them itself if the namespace outlives a short grace.
// A caller that keeps the namespace, an operator among them, leaves it
// out so that the capture is gone when RemovePod returns.
func NamespaceTeardown() RemoveOption {
	return func(r *nftredirv1.RemovePodRequest) { r.NamespaceTeardown = true }
}

// GetPod returns a pod's record, the live state of its namespace and its
// live ruleset. A pod that is not enrolled gives NotFound.
func (c *Client) GetPod(ctx context.Context, podUID string) (*nftredirv1.GetPodResponse, error) {
	return call(ctx, c, func(ctx context.Context) (*nftredirv1.GetPodResponse, error) {
		return c.rpc.GetPod(ctx, &nftredirv1.GetPodRequest{PodUid: podUID})
	})
}

// ListPods returns every enrolled pod.
func (c *Client) ListPods(ctx context.Context) ([]*nftredirv1.Pod, error) {
	resp, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	return resp.GetPods(), nil
}

// List returns the whole ListPods answer: the enrolled pods and the
// records quarantined as corrupt whose pods were not released.
func (c *Client) List(ctx context.Context) (*nftredirv1.ListPodsResponse, error) {
	return call(ctx, c, func(ctx context.Context) (*nftredirv1.ListPodsResponse, error) {
		return c.rpc.ListPods(ctx, &nftredirv1.ListPodsRequest{})
	})
}

// HealthStatus is the daemon's answer to grpc.health.v1 Check for the
// server as a whole and for the RedirectService.
type HealthStatus struct {
	Server  healthpb.HealthCheckResponse_ServingStatus
	Service healthpb.HealthCheckResponse_ServingStatus
}

// Serving reports whether the daemon accepts API calls: both statuses are
// SERVING (the daemon reports NOT_SERVING until its startup reconcile is
// done, and again while stopping).
func (h HealthStatus) Serving() bool {
	return h.Server == healthpb.HealthCheckResponse_SERVING &&
		h.Service == healthpb.HealthCheckResponse_SERVING
}

// Health asks the daemon for its health. NOT_SERVING is a status, not an
// error; an error means the daemon could not be asked.
func (c *Client) Health(ctx context.Context) (HealthStatus, error) {
	var h HealthStatus
	for _, q := range []struct {
		service string
		out     *healthpb.HealthCheckResponse_ServingStatus
	}{{"", &h.Server}, {ServiceName, &h.Service}} {
		resp, err := call(ctx, c, func(ctx context.Context) (*healthpb.HealthCheckResponse, error) {
			return c.health.Check(ctx, &healthpb.HealthCheckRequest{Service: q.service})
		})
		if err != nil {
			return HealthStatus{}, err
		}
		*q.out = resp.GetStatus()
	}
	return h, nil
}

// Watch is an open WatchPods stream. Like any gRPC stream, it is read from
// one goroutine at a time.
type Watch struct {
	stream grpc.ServerStreamingClient[nftredirv1.WatchPodsResponse]
	cancel context.CancelFunc
	// first holds the event read while opening the stream, so that Recv
	// returns it before anything else.
	first *nftredirv1.WatchPodsResponse
}

// Recv returns the next event. It returns io.EOF when the daemon ended the
// stream cleanly, and otherwise the stream's status error (Canceled after
// Close). After any error the watch is over: open a new one and treat its
// snapshot as the full set.
func (w *Watch) Recv() (*nftredirv1.WatchPodsResponse, error) {
	if first := w.first; first != nil {
		w.first = nil
		return first, nil
	}
	return w.stream.Recv()
}

// Close ends the watch. Cancelling the context given to WatchPods does too.
func (w *Watch) Close() {
	w.cancel()
}

// WatchPods opens the stream of enrolled pods: their snapshot, a
// SNAPSHOT_DONE event, then every change, until Close or ctx ends it.
//
// Opening is retried on Unavailable until the first event arrives; the
// daemon always sends one (at least SNAPSHOT_DONE), so once WatchPods
// returns the stream is known to be live. Later errors are not retried,
// because the caller must resynchronise from a new snapshot anyway. The
// client's timeout bounds only the opening.
func (c *Client) WatchPods(ctx context.Context) (*Watch, error) {
	return call(ctx, c, func(openCtx context.Context) (*Watch, error) {
		// The stream lives on ctx, not openCtx, so that it outlasts the
		// opening; openCtx's deadline still applies to the first event
		// because it cancels the stream until stop is called.
		streamCtx, cancelStream := context.WithCancel(ctx)
		stop := context.AfterFunc(openCtx, cancelStream)
		stream, err := c.rpc.WatchPods(streamCtx, &nftredirv1.WatchPodsRequest{})
		var first *nftredirv1.WatchPodsResponse
		if err == nil {
			first, err = stream.Recv()
		}
		if !stop() {
			// openCtx ended first and took the stream with it; say why
			// rather than reporting our own cancellation.
			err = status.FromContextError(openCtx.Err()).Err()
		}
		if err != nil {
			cancelStream()
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "watch ended before its first event")
			}
			return nil, err
		}
		return &Watch{stream: stream, cancel: cancelStream, first: first}, nil
	})
}

// call runs one idempotent unary call under the client's timeout, retrying
// it with backoff while it fails with Unavailable and ctx allows.
func call[T any](ctx context.Context, c *Client, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	return retry.Do(ctx, c.cfg.retry, func(err error) bool { return status.Code(err) == codes.Unavailable }, f)
}

func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.timeout)
}
