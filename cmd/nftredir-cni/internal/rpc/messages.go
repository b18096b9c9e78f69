package rpc

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
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
}

// IsZero reports whether o asks for nothing.
func (o *Options) IsZero() bool {
	return o == nil || (o.CaptureMode == 0 && len(o.ExcludeInboundPorts) == 0 && len(o.ExcludeOutboundPorts) == 0 &&
		len(o.ExcludeOutboundCIDRs) == 0 && o.DNSCapture == nil && o.IPv6 == nil && o.InboundCapture == nil)
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

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBool(b []byte, num protowire.Number, v *bool) []byte {
	if v == nil {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeBool(*v))
}

// appendPacked writes a repeated uint32 packed, as proto3 does.
func appendPacked(b []byte, num protowire.Number, vs []uint32) []byte {
	if len(vs) == 0 {
		return b
	}
	var p []byte
	for _, v := range vs {
		p = protowire.AppendVarint(p, uint64(v))
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, p)
}

func (o *Options) marshal() []byte {
	var b []byte
	if o.CaptureMode != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(o.CaptureMode)))
	}
	b = appendPacked(b, 2, o.ExcludeInboundPorts)
	b = appendPacked(b, 3, o.ExcludeOutboundPorts)
	for _, s := range o.ExcludeOutboundCIDRs {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	b = appendBool(b, 5, o.DNSCapture)
	b = appendBool(b, 6, o.IPv6)
	return appendBool(b, 7, o.InboundCapture)
}

func (r *AddPodRequest) marshal() []byte {
	var b []byte
	b = appendString(b, 1, r.PodUID)
	b = appendString(b, 2, r.PodName)
	b = appendString(b, 3, r.PodNamespace)
	b = appendString(b, 4, r.NetnsPath)
	for _, s := range r.PodIPs {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	if r.Options != nil {
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Options.marshal())
	}
	return b
}

// marshalString is a message whose only field is string 1 (RemovePod,
// GetPod, health Check requests).
func marshalString(s string) []byte { return appendString(nil, 1, s) }

// fields calls f for each field of a message, with the field's value for
// bytes and varint fields; other wire types are skipped. It fails on
// malformed input.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if err := f(num, typ, v, nil); err != nil {
				return err
			}
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if err := f(num, typ, 0, v); err != nil {
				return err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

// decodeErr is a response that is not the message it should be.
func decodeErr(what string, err error) error {
	return errorf(Internal, fmt.Sprintf("grpc: failed to unmarshal the received message: %s: %v", what, err))
}

func unmarshalPod(b []byte) (*Pod, error) {
	p := &Pod{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		if typ == protowire.BytesType {
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
				return fields(bs, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
					if num == 1 && typ == protowire.VarintType {
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
	err := fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, bs []byte) error {
		var err error
		switch {
		case num == 1 && typ == protowire.BytesType:
			r.Pod, err = unmarshalPod(bs)
		case num == 2 && typ == protowire.BytesType:
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
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		var err error
		switch {
		case num == 1 && typ == protowire.BytesType:
			r.Pod, err = unmarshalPod(bs)
		case num == 2 && typ == protowire.VarintType:
			r.SyncStatus = SyncStatus(int32(v))
		case num == 3 && typ == protowire.BytesType:
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
	err := fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, bs []byte) error {
		if num == 1 && typ == protowire.BytesType {
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
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
		if num == 1 && typ == protowire.VarintType {
			out = v
		}
		return nil
	})
	if err != nil {
		return 0, decodeErr(what, err)
	}
	return out, nil
}
