package lifecycle

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

// podProto renders a record as the API's Pod, with every option explicit
// (the effective options, daemon defaults filled in).
func podProto(r *state.Record) *nftredirv1.Pod {
	s := r.Spec
	// Records are checked when read, so the name parses; were it not to,
	// the zero mode (TPROXY) is what the pod was enrolled with.
	m, _ := defaults.ParseCaptureMode(s.Mode)
	mode := apimode.ToAPI(m)
	opts := &nftredirv1.RedirectOptions{
		CaptureMode:              mode,
		ExcludeOutboundCidrs:     append([]string(nil), s.ExcludeOutboundCIDRs...),
		DnsCapture:               proto.Bool(s.CaptureDNS),
		Ipv6:                     proto.Bool(s.IPv6),
		InboundCapture:           proto.Bool(s.InboundCapture),
		TproxyIpv4:               proto.String(s.TProxyV4),
		TproxyIpv6:               proto.String(s.TProxyV6),
		RerouteVirtualInterfaces: append([]string(nil), s.RerouteInterfaces...),
	}
	for _, p := range s.ExcludeInboundPorts {
		opts.ExcludeInboundPorts = append(opts.ExcludeInboundPorts, uint32(p))
	}
	for _, p := range s.ExcludeOutboundPorts {
		opts.ExcludeOutboundPorts = append(opts.ExcludeOutboundPorts, uint32(p))
	}
	pod := &nftredirv1.Pod{
		PodUid:       r.PodUID,
		PodName:      r.PodName,
		PodNamespace: r.PodNamespace,
		NetnsPath:    r.NetnsPath,
		NetnsId:      r.NetnsID,
		PodIps:       append([]string(nil), r.PodIPs...),
		Options:      opts,
		EnrolledAt:   timestamppb.New(r.EnrolledAt),
		UpdatedAt:    timestamppb.New(r.UpdatedAt),
	}
	if r.ServiceAccount != nil {
		pod.ServiceAccount = proto.String(*r.ServiceAccount)
	}
	return pod
}
