//go:build ignore

// Variant (d) for measurement only: today's client (its own HTTP/2
// framing, h2.go) with AddPod's messages encoded and decoded by the
// protobuf runtime and the generated messages (without grpc-go), to show
// what the protobuf runtime alone costs the exec.
package rpc

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/retry"
	pb "github.com/nftredir/nftredir/proto/msgonly"
)

// DefaultSocket is where nftredird listens unless told otherwise.
const DefaultSocket = defaults.Socket

// ServiceName is the RedirectService's full name, which is also its
// grpc.health.v1 service name.
const ServiceName = "nftredir.v1.RedirectService"

// Client talks to one nftredird. A call that fails with Unavailable (the
// daemon not listening, restarting, or the connection lost) is retried
// with backoff, on a new connection, by package client's loop and
// schedule (internal/retry), all within the timeout. Calls are
// serialised.
type Client struct {
	socket  string
	timeout time.Duration
	retry   retry.Schedule

	mu sync.Mutex
	c  *conn
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds every call, retries included, unless the caller's
// context ends sooner. Zero leaves calls bounded by the context alone.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithRetry sets how often a call failing with Unavailable is tried in all
// (1: never again) and the first pause between tries.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *Client) { c.retry.Attempts, c.retry.Backoff = max(attempts, 1), backoff }
}

// New returns a client of the daemon at socket. It connects on the first
// call.
func New(socket string, opts ...Option) (*Client, error) {
	if socket == "" {
		return nil, errors.New("empty socket path")
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, err
	}
	c := &Client{socket: abs, timeout: defaults.CallTimeout, retry: retry.Default()}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Close closes the connection, if any.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.close()
		c.c = nil
	}
}

// AddPod enrols a pod, or re-applies it, and returns the daemon's answer.
func (c *Client) AddPod(ctx context.Context, req *AddPodRequest) (*AddPodResponse, error) {
	m := &pb.AddPodRequest{PodUid: req.PodUID, PodName: req.PodName, PodNamespace: req.PodNamespace,
		NetnsPath: req.NetnsPath, PodIps: req.PodIPs}
	if o := req.Options; o != nil {
		m.Options = &pb.RedirectOptions{CaptureMode: pb.CaptureMode(o.CaptureMode), ExcludeInboundPorts: o.ExcludeInboundPorts,
			ExcludeOutboundPorts: o.ExcludeOutboundPorts, ExcludeOutboundCidrs: o.ExcludeOutboundCIDRs, DnsCapture: o.DNSCapture,
			Ipv6: o.IPv6, InboundCapture: o.InboundCapture}
	}
	enc, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	b, err := c.call(ctx, "/nftredir.v1.RedirectService/AddPod", enc)
	if err != nil {
		return nil, err
	}
	var r pb.AddPodResponse
	if err := proto.Unmarshal(b, &r); err != nil {
		return nil, decodeErr("nftredir.v1.AddPodResponse", err)
	}
	out := &AddPodResponse{NotCapturedReason: r.NotCapturedReason}
	if p := r.Pod; p != nil {
		out.Pod = &Pod{PodUID: p.PodUid, PodName: p.PodName, PodNamespace: p.PodNamespace, NetnsPath: p.NetnsPath, NetnsID: p.NetnsId,
			PodIPs: p.PodIps, CaptureMode: CaptureMode(p.GetOptions().GetCaptureMode())}
	}
	return out, nil
}

// RemovePod releases a pod; existed says whether there was one. With
// req.NetnsPath set, a pod enrolled with another namespace is left alone
// and the call fails with FailedPrecondition.
func (c *Client) RemovePod(ctx context.Context, req *RemovePodRequest) (existed bool, err error) {
	b, err := c.call(ctx, "/nftredir.v1.RedirectService/RemovePod", req.marshal())
	if err != nil {
		return false, err
	}
	v, err := unmarshalVarintField1(b, "nftredir.v1.RemovePodResponse")
	return v != 0, err
}

// GetPod returns a pod's record and live state; NotFound when it is not
// enrolled.
func (c *Client) GetPod(ctx context.Context, podUID string) (*GetPodResponse, error) {
	b, err := c.call(ctx, "/nftredir.v1.RedirectService/GetPod", marshalString(podUID))
	if err != nil {
		return nil, err
	}
	return unmarshalGetPodResponse(b)
}

// ListPods returns every enrolled pod.
func (c *Client) ListPods(ctx context.Context) ([]*Pod, error) {
	b, err := c.call(ctx, "/nftredir.v1.RedirectService/ListPods", nil)
	if err != nil {
		return nil, err
	}
	return unmarshalListPodsResponse(b)
}

// Health is the daemon's grpc.health.v1 answer for the server as a whole
// and for the RedirectService.
type Health struct {
	Server, Service ServingStatus
}

// Serving reports whether the daemon takes API calls.
func (h Health) Serving() bool { return h.Server == Serving && h.Service == Serving }

// Health asks the daemon for its health. NOT_SERVING is a status, not an
// error.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	for _, q := range []struct {
		service string
		out     *ServingStatus
	}{{"", &h.Server}, {ServiceName, &h.Service}} {
		b, err := c.call(ctx, "/grpc.health.v1.Health/Check", marshalString(q.service))
		if err != nil {
			return Health{}, err
		}
		v, err := unmarshalVarintField1(b, "grpc.health.v1.HealthCheckResponse")
		if err != nil {
			return Health{}, err
		}
		*q.out = ServingStatus(int32(v))
	}
	return h, nil
}

// call runs one unary call under the client's timeout, retrying it with
// backoff while it fails with Unavailable and time allows.
func (c *Client) call(ctx context.Context, method string, req []byte) ([]byte, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return retry.Do(ctx, c.retry, func(err error) bool { return CodeOf(err) == Unavailable }, func(ctx context.Context) ([]byte, error) {
		return c.once(ctx, method, req)
	})
}

func (c *Client) once(ctx context.Context, method string, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, errorf(DeadlineExceeded, "context deadline exceeded")
		}
		return nil, errorf(Canceled, "context canceled")
	}
	if c.c == nil {
		cn, err := dial(ctx, c.socket)
		if err != nil {
			return nil, err
		}
		c.c = cn
	}
	resp, err := c.c.unary(ctx, method, req)
	if dl, ok := ctx.Deadline(); ok && CodeOf(err) == Canceled && !time.Now().Before(dl) {
		// The daemon's end of the same deadline (the grpc-timeout it
		// was sent) resets the stream once it passes, which can be seen
		// before the context's own timer has fired; the call ran out of
		// time either way.
		err = errorf(DeadlineExceeded, "context deadline exceeded")
	}
	var e *Error
	if err != nil && (!errors.As(err, &e) || e.Code == Unavailable || e.Code == Internal) || !c.c.usable() {
		// The connection may be broken or out of step; the next call
		// starts afresh.
		c.c.close()
		c.c = nil
	}
	return resp, err
}
