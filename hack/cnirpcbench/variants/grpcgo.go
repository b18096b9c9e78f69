//go:build ignore

// Variant (b) for measurement only: the plugin's rpc API over grpc-go and
// the generated client (package client: grpc.NewClient on unix://, insecure
// credentials, the same timeout and retry).
package rpc

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/retry"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

const DefaultSocket = defaults.Socket
const ServiceName = "nftredir.v1.RedirectService"

type Client struct {
	socket  string
	timeout time.Duration
	retry   retry.Schedule
	c       *client.Client
}

type Option func(*Client)

func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *Client) { c.retry.Attempts, c.retry.Backoff = max(attempts, 1), backoff }
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
	c.c, err = client.Dial(context.Background(), abs, client.WithTimeout(c.timeout), client.WithRetry(c.retry.Attempts, c.retry.Backoff))
	return c, err
}

func (c *Client) Close() { _ = c.c.Close() }

func conv(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	return &Error{Code: Code(st.Code()), Message: st.Message()}
}

func pbOpts(o *Options) *nftredirv1.RedirectOptions {
	if o == nil {
		return nil
	}
	return &nftredirv1.RedirectOptions{CaptureMode: nftredirv1.CaptureMode(o.CaptureMode), ExcludeInboundPorts: o.ExcludeInboundPorts,
		ExcludeOutboundPorts: o.ExcludeOutboundPorts, ExcludeOutboundCidrs: o.ExcludeOutboundCIDRs, DnsCapture: o.DNSCapture,
		Ipv6: o.IPv6, InboundCapture: o.InboundCapture}
}

func pod(p *nftredirv1.Pod) *Pod {
	if p == nil {
		return nil
	}
	return &Pod{PodUID: p.PodUid, PodName: p.PodName, PodNamespace: p.PodNamespace, NetnsPath: p.NetnsPath, NetnsID: p.NetnsId,
		PodIPs: p.PodIps, CaptureMode: CaptureMode(p.GetOptions().GetCaptureMode())}
}

func (c *Client) AddPod(ctx context.Context, req *AddPodRequest) (*AddPodResponse, error) {
	r, err := c.c.AddPodResponse(ctx, &nftredirv1.AddPodRequest{PodUid: req.PodUID, PodName: req.PodName, PodNamespace: req.PodNamespace,
		NetnsPath: req.NetnsPath, PodIps: req.PodIPs, Options: pbOpts(req.Options)})
	if err != nil {
		return nil, conv(err)
	}
	return &AddPodResponse{Pod: pod(r.Pod), NotCapturedReason: r.NotCapturedReason}, nil
}

func (c *Client) RemovePod(ctx context.Context, req *RemovePodRequest) (bool, error) {
	var o []client.RemoveOption
	if req.NetnsPath != "" {
		o = append(o, client.IfNetns(req.NetnsPath))
	}
	if req.NamespaceTeardown {
		o = append(o, client.NamespaceTeardown())
	}
	ok, err := c.c.RemovePod(ctx, req.PodUID, o...)
	return ok, conv(err)
}

func (c *Client) GetPod(ctx context.Context, podUID string) (*GetPodResponse, error) {
	r, err := c.c.GetPod(ctx, podUID)
	if err != nil {
		return nil, conv(err)
	}
	return &GetPodResponse{Pod: pod(r.Pod), SyncStatus: SyncStatus(r.SyncStatus), Detail: r.Detail}, nil
}

func (c *Client) ListPods(ctx context.Context) ([]*Pod, error) {
	ps, err := c.c.ListPods(ctx)
	if err != nil {
		return nil, conv(err)
	}
	var out []*Pod
	for _, p := range ps {
		out = append(out, pod(p))
	}
	return out, nil
}

type Health struct{ Server, Service ServingStatus }

func (h Health) Serving() bool { return h.Server == Serving && h.Service == Serving }

func (c *Client) Health(ctx context.Context) (Health, error) {
	h, err := c.c.Health(ctx)
	if err != nil {
		return Health{}, conv(err)
	}
	return Health{Server: ServingStatus(h.Server), Service: ServingStatus(h.Service)}, nil
}
