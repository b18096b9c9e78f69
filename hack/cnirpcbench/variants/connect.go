//go:build ignore

// Variant (c) for measurement only: the plugin's rpc API over connect-go
// (gRPC protocol) on net/http's unencrypted HTTP/2, generated messages
// without grpc-go.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/retry"
	pb "github.com/nftredir/nftredir/proto/msgonly"
)

const DefaultSocket = defaults.Socket
const ServiceName = "nftredir.v1.RedirectService"

type Client struct {
	socket  string
	timeout time.Duration
	retry   retry.Schedule
	hc      *http.Client
	add     *connect.Client[pb.AddPodRequest, pb.AddPodResponse]
	remove  *connect.Client[pb.RemovePodRequest, pb.RemovePodResponse]
	get     *connect.Client[pb.GetPodRequest, pb.GetPodResponse]
	list    *connect.Client[pb.ListPodsRequest, pb.ListPodsResponse]
	health  *connect.Client[[]byte, []byte]
}

type Option func(*Client)

func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *Client) { c.retry.Attempts, c.retry.Backoff = max(attempts, 1), backoff }
}

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return nil, fmt.Errorf("raw codec: %T", v)
}
func (rawCodec) Unmarshal(b []byte, v any) error {
	if p, ok := v.(*[]byte); ok {
		*p = append((*p)[:0], b...)
		return nil
	}
	return fmt.Errorf("raw codec: %T", v)
}

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
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", abs)
	}}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	c.hc = &http.Client{Transport: tr}
	const base = "http://localhost/nftredir.v1.RedirectService/"
	c.add = connect.NewClient[pb.AddPodRequest, pb.AddPodResponse](c.hc, base+"AddPod", connect.WithGRPC())
	c.remove = connect.NewClient[pb.RemovePodRequest, pb.RemovePodResponse](c.hc, base+"RemovePod", connect.WithGRPC())
	c.get = connect.NewClient[pb.GetPodRequest, pb.GetPodResponse](c.hc, base+"GetPod", connect.WithGRPC())
	c.list = connect.NewClient[pb.ListPodsRequest, pb.ListPodsResponse](c.hc, base+"ListPods", connect.WithGRPC())
	c.health = connect.NewClient[[]byte, []byte](c.hc, "http://localhost/grpc.health.v1.Health/Check", connect.WithGRPC(), connect.WithCodec(rawCodec{}))
	return c, nil
}

func (c *Client) Close() { c.hc.CloseIdleConnections() }

func do[T any](ctx context.Context, c *Client, f func(context.Context) (T, error)) (T, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	v, err := retry.Do(ctx, c.retry, func(err error) bool { return connect.CodeOf(err) == connect.CodeUnavailable }, f)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return v, &Error{Code: Code(ce.Code()), Message: ce.Message()}
		}
		return v, &Error{Code: Unknown, Message: err.Error()}
	}
	return v, nil
}

func pbOpts(o *Options) *pb.RedirectOptions {
	if o == nil {
		return nil
	}
	return &pb.RedirectOptions{CaptureMode: pb.CaptureMode(o.CaptureMode), ExcludeInboundPorts: o.ExcludeInboundPorts,
		ExcludeOutboundPorts: o.ExcludeOutboundPorts, ExcludeOutboundCidrs: o.ExcludeOutboundCIDRs, DnsCapture: o.DNSCapture,
		Ipv6: o.IPv6, InboundCapture: o.InboundCapture}
}

func pod(p *pb.Pod) *Pod {
	if p == nil {
		return nil
	}
	return &Pod{PodUID: p.PodUid, PodName: p.PodName, PodNamespace: p.PodNamespace, NetnsPath: p.NetnsPath, NetnsID: p.NetnsId,
		PodIPs: p.PodIps, CaptureMode: CaptureMode(p.GetOptions().GetCaptureMode())}
}

func (c *Client) AddPod(ctx context.Context, req *AddPodRequest) (*AddPodResponse, error) {
	m := &pb.AddPodRequest{PodUid: req.PodUID, PodName: req.PodName, PodNamespace: req.PodNamespace,
		NetnsPath: req.NetnsPath, PodIps: req.PodIPs, Options: pbOpts(req.Options)}
	r, err := do(ctx, c, func(ctx context.Context) (*connect.Response[pb.AddPodResponse], error) {
		return c.add.CallUnary(ctx, connect.NewRequest(m))
	})
	if err != nil {
		return nil, err
	}
	return &AddPodResponse{Pod: pod(r.Msg.Pod), NotCapturedReason: r.Msg.NotCapturedReason}, nil
}

func (c *Client) RemovePod(ctx context.Context, req *RemovePodRequest) (bool, error) {
	m := &pb.RemovePodRequest{PodUid: req.PodUID, NetnsPath: req.NetnsPath, NamespaceTeardown: req.NamespaceTeardown}
	r, err := do(ctx, c, func(ctx context.Context) (*connect.Response[pb.RemovePodResponse], error) {
		return c.remove.CallUnary(ctx, connect.NewRequest(m))
	})
	if err != nil {
		return false, err
	}
	return r.Msg.Existed, nil
}

func (c *Client) GetPod(ctx context.Context, podUID string) (*GetPodResponse, error) {
	r, err := do(ctx, c, func(ctx context.Context) (*connect.Response[pb.GetPodResponse], error) {
		return c.get.CallUnary(ctx, connect.NewRequest(&pb.GetPodRequest{PodUid: podUID}))
	})
	if err != nil {
		return nil, err
	}
	return &GetPodResponse{Pod: pod(r.Msg.Pod), SyncStatus: SyncStatus(r.Msg.SyncStatus), Detail: r.Msg.Detail}, nil
}

func (c *Client) ListPods(ctx context.Context) ([]*Pod, error) {
	r, err := do(ctx, c, func(ctx context.Context) (*connect.Response[pb.ListPodsResponse], error) {
		return c.list.CallUnary(ctx, connect.NewRequest(&pb.ListPodsRequest{}))
	})
	if err != nil {
		return nil, err
	}
	var out []*Pod
	for _, p := range r.Msg.Pods {
		out = append(out, pod(p))
	}
	return out, nil
}

type Health struct{ Server, Service ServingStatus }

func (h Health) Serving() bool { return h.Server == Serving && h.Service == Serving }

func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	for _, q := range []struct {
		service string
		out     *ServingStatus
	}{{"", &h.Server}, {ServiceName, &h.Service}} {
		b := marshalString(q.service)
		r, err := do(ctx, c, func(ctx context.Context) (*connect.Response[[]byte], error) {
			return c.health.CallUnary(ctx, connect.NewRequest(&b))
		})
		if err != nil {
			return Health{}, err
		}
		v, err := unmarshalVarintField1(*r.Msg, "grpc.health.v1.HealthCheckResponse")
		if err != nil {
			return Health{}, err
		}
		*q.out = ServingStatus(int32(v))
	}
	return h, nil
}
