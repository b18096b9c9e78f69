package rpc

import (
	"fmt"
	"strconv"

	"github.com/nftredir/nftredir/internal/defaults"
)

// The messages below are the fields of nftredir.v1 (proto/nftredir/v1/
// nftredir.proto) and grpc.health.v1 that the plugin sends or reads, by
// their field numbers; every other field of a response is skipped, as any
// protobuf decoder skips fields it does not know. Tests hold the encoding
// to the generated code's.

// CaptureMode is nftredir.v1.CaptureMode.
type CaptureMode int32

// The capture modes.
const (
	CaptureModeUnspecified CaptureMode = 0
	CaptureModeTPROXY      CaptureMode = 1
	CaptureModeREDIRECT    CaptureMode = 2
)

// String is the enum value's protobuf name.
func (m CaptureMode) String() string {
	switch m {
	case CaptureModeUnspecified:
		return "CAPTURE_MODE_UNSPECIFIED"
	case CaptureModeTPROXY:
		return "CAPTURE_MODE_TPROXY"
	case CaptureModeREDIRECT:
		return "CAPTURE_MODE_REDIRECT"
	}
	return strconv.Itoa(int(m))
}

// SyncStatus is nftredir.v1.SyncStatus.
type SyncStatus int32

// The sync statuses.
const (
	SyncUnspecified SyncStatus = 0
	SyncInSync      SyncStatus = 1
	SyncDrifted     SyncStatus = 2
	SyncNetnsGone   SyncStatus = 3
	SyncAbsent      SyncStatus = 4
	SyncQuarantined SyncStatus = 5
)

var syncNames = [...]string{"SYNC_STATUS_UNSPECIFIED", "SYNC_STATUS_IN_SYNC", "SYNC_STATUS_DRIFTED",
	"SYNC_STATUS_NETNS_GONE", "SYNC_STATUS_ABSENT", "SYNC_STATUS_QUARANTINED"}

// String is the enum value's protobuf name.
func (s SyncStatus) String() string {
	if s >= 0 && int(s) < len(syncNames) {
		return syncNames[s]
	}
	return strconv.Itoa(int(s))
}

// ServingStatus is grpc.health.v1.HealthCheckResponse.ServingStatus.
type ServingStatus int32

// The serving statuses.
const (
	ServingUnknown        ServingStatus = 0
	Serving               ServingStatus = 1
	NotServing            ServingStatus = 2
	ServingServiceUnknown ServingStatus = 3
)

// String is the enum value's protobuf name.
func (s ServingStatus) String() string {
	switch s {
	case ServingUnknown:
		return "UNKNOWN"
	case Serving:
		return "SERVING"
	case NotServing:
		return "NOT_SERVING"
	case ServingServiceUnknown:
		return "SERVICE_UNKNOWN"
	}
	return strconv.Itoa(int(s))
}

// Options is nftredir.v1.RedirectOptions as the plugin sends it. Unset
// (zero, nil) fields are left to the daemon.
type Options struct {
	CaptureMode          CaptureMode
	ExcludeInboundPorts  []uint32
	ExcludeOutboundPorts []uint32
	ExcludeOutboundCIDRs []string
	DNSCapture           *bool
	IPv6                 *bool
	InboundCapture       *bool
	// RerouteVirtualInterfaces names interfaces inside the pod whose
	// incoming TCP is the pod's outbound (Istio's
	// istio.io/reroute-virtual-interfaces); the daemon checks the names.
	RerouteVirtualInterfaces []string
}

// IsZero reports whether o asks for nothing.
func (o *Options) IsZero() bool {
	return o == nil || (o.CaptureMode == 0 && len(o.ExcludeInboundPorts) == 0 && len(o.ExcludeOutboundPorts) == 0 &&
		len(o.ExcludeOutboundCIDRs) == 0 && o.DNSCapture == nil && o.IPv6 == nil && o.InboundCapture == nil &&
		len(o.RerouteVirtualInterfaces) == 0)
}

// AddPodRequest is nftredir.v1.AddPodRequest.
type AddPodRequest struct {
	PodUID       string
	PodName      string
	PodNamespace string
	NetnsPath    string
	PodIPs       []string
	// Options nil sends none: every daemon default.
	Options *Options
}

// RemovePodRequest is nftredir.v1.RemovePodRequest.
type RemovePodRequest struct {
	PodUID string
	// NetnsPath, if set, releases the pod only if it is enrolled with
	// this namespace.
	NetnsPath string
	// NamespaceTeardown tells the daemon the caller deletes the
	// namespace next, so it need not enter it.
	NamespaceTeardown bool
}

// Pod is the part of nftredir.v1.Pod the plugin reads.
type Pod struct {
	PodUID       string
	PodName      string
	PodNamespace string
	NetnsPath    string
	NetnsID      string
	PodIPs       []string
	// CaptureMode is options.capture_mode, the mode the daemon applied.
	CaptureMode CaptureMode
}

// AddPodResponse is nftredir.v1.AddPodResponse.
type AddPodResponse struct {
	// Pod is nil when the daemon's enrolment policy left the pod alone.
	Pod               *Pod
	NotCapturedReason string
}

// GetPodResponse is the part of nftredir.v1.GetPodResponse the plugin
// reads.
type GetPodResponse struct {
	Pod        *Pod
	SyncStatus SyncStatus
	Detail     string
}

func appendString(b []byte, num int, s string) []byte {
	if s == "" {
		return b
	}
	return appendStringField(b, num, s)
}

func appendBool(b []byte, num int, v *bool) []byte {
	if v == nil {
		return b
	}
	x := uint64(0)
	if *v {
		x = 1
	}
	return appendVarintField(b, num, x)
}

// appendPacked writes a repeated uint32 packed, as proto3 does.
func appendPacked(b []byte, num int, vs []uint32) []byte {
	if len(vs) == 0 {
		return b
	}
	var p []byte
	for _, v := range vs {
		p = appendVarint(p, uint64(v))
	}
	return appendBytes(b, num, p)
}

func (o *Options) marshal() []byte {
	var b []byte
	if o.CaptureMode != 0 {
		// Enums are int32, sign-extended to 64 bits on the wire.
		b = appendVarintField(b, 1, uint64(int64(o.CaptureMode)))
	}
	b = appendPacked(b, 2, o.ExcludeInboundPorts)
	b = appendPacked(b, 3, o.ExcludeOutboundPorts)
	for _, s := range o.ExcludeOutboundCIDRs {
		b = appendStringField(b, 4, s)
	}
	b = appendBool(b, 5, o.DNSCapture)
	b = appendBool(b, 6, o.IPv6)
	b = appendBool(b, 7, o.InboundCapture)
	for _, s := range o.RerouteVirtualInterfaces {
		b = appendStringField(b, 10, s)
	}
	return b
}

func (r *AddPodRequest) marshal() []byte {
	var b []byte
	b = appendString(b, 1, r.PodUID)
	b = appendString(b, 2, r.PodName)
	b = appendString(b, 3, r.PodNamespace)
	b = appendString(b, 4, r.NetnsPath)
	for _, s := range r.PodIPs {
		b = appendStringField(b, 5, s)
	}
	if r.Options != nil {
		b = appendBytes(b, 6, r.Options.marshal())
	}
	return b
}

func (r *RemovePodRequest) marshal() []byte {
	var b []byte
	b = appendString(b, 1, r.PodUID)
	b = appendString(b, 2, r.NetnsPath)
	if r.NamespaceTeardown {
		// proto3 leaves a false bool off the wire.
		b = appendVarintField(b, 3, 1)
	}
	return b
}

// marshalString is a message whose only field is string 1 (GetPod and
// health Check requests).
func marshalString(s string) []byte { return appendString(nil, 1, s) }

// decodeErr is a response that is not the message it should be.
func decodeErr(what string, err error) error {
	return errorf(Internal, fmt.Sprintf("grpc: failed to unmarshal the received message: %s: %v", what, err))
}

func unmarshalPod(b []byte) (*Pod, error) {
	p := &Pod{}
	err := fields(b, func(num int, typ wireType, v uint64, bs []byte) error {
		if typ == bytesType {
			switch num {
			case 1:
				p.PodUID = string(bs)
			case 2:
				p.PodName = string(bs)
			case 3:
				p.PodNamespace = string(bs)
			case 4:
				p.NetnsPath = string(bs)
			case 5:
				p.NetnsID = string(bs)
			case 6:
				p.PodIPs = append(p.PodIPs, string(bs))
			case 7:
				return fields(bs, func(num int, typ wireType, v uint64, _ []byte) error {
					if num == 1 && typ == varintType {
						p.CaptureMode = CaptureMode(int32(v))
					}
					return nil
				})
			}
		}
		return nil
	})
	if err != nil {
		return nil, decodeErr("nftredir.v1.Pod", err)
	}
	return p, nil
}

func unmarshalAddPodResponse(b []byte) (*AddPodResponse, error) {
	r := &AddPodResponse{}
	err := fields(b, func(num int, typ wireType, _ uint64, bs []byte) error {
		var err error
		switch {
		case num == 1 && typ == bytesType:
			r.Pod, err = unmarshalPod(bs)
		case num == 2 && typ == bytesType:
			r.NotCapturedReason = string(bs)
		}
		return err
	})
	if err != nil {
		return nil, decodeErr("nftredir.v1.AddPodResponse", err)
	}
	return r, nil
}

func unmarshalGetPodResponse(b []byte) (*GetPodResponse, error) {
	r := &GetPodResponse{}
	err := fields(b, func(num int, typ wireType, v uint64, bs []byte) error {
		var err error
		switch {
		case num == 1 && typ == bytesType:
			r.Pod, err = unmarshalPod(bs)
		case num == 2 && typ == varintType:
			r.SyncStatus = SyncStatus(int32(v))
		case num == 3 && typ == bytesType:
			r.Detail = string(bs)
		}
		return err
	})
	if err != nil {
		return nil, decodeErr("nftredir.v1.GetPodResponse", err)
	}
	return r, nil
}

func unmarshalListPodsResponse(b []byte) ([]*Pod, error) {
	var pods []*Pod
	err := fields(b, func(num int, typ wireType, _ uint64, bs []byte) error {
		if num == 1 && typ == bytesType {
			p, err := unmarshalPod(bs)
			if err != nil {
				return err
			}
			pods = append(pods, p)
		}
		return nil
	})
	if err != nil {
		return nil, decodeErr("nftredir.v1.ListPodsResponse", err)
	}
	return pods, nil
}

// unmarshalVarintField1 reads a message whose field 1 is a bool or an enum
// (RemovePodResponse.existed, HealthCheckResponse.status).
func unmarshalVarintField1(b []byte, what string) (uint64, error) {
	var out uint64
	err := fields(b, func(num int, typ wireType, v uint64, _ []byte) error {
		if num == 1 && typ == varintType {
			out = v
		}
		return nil
	})
	if err != nil {
		return 0, decodeErr(what, err)
	}
	return out, nil
}

// CaptureModeOf is the API's value of a capture mode of the vocabulary;
// CaptureModeUnspecified for one this plugin does not know.
func CaptureModeOf(m defaults.CaptureMode) CaptureMode {
	switch m {
	case defaults.TProxy:
		return CaptureModeTPROXY
	case defaults.Redirect:
		return CaptureModeREDIRECT
	}
	return CaptureModeUnspecified
}
