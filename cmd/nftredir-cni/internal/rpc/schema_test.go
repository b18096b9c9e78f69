package rpc

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// The client encodes and decodes its messages by field numbers written
// into messages.go by hand. These tests hold every number and wire type
// it writes or reads to the generated descriptors (proto/nftredir/v1 and
// grpc.health.v1), field by field and found by name, not by a second hand
// copy of the numbers: a Go field named PodUID is the proto field pod_uid,
// whatever its number. They also fail when the API grows a request field
// the plugin neither sends nor lists as deliberately not sent, which is
// how a field such as reroute_virtual_interfaces could go missing before.

var (
	apiFile    = nftredirv1.File_nftredir_v1_nftredir_proto
	healthFile = healthpb.File_grpc_health_v1_health_proto
)

func msgDesc(t *testing.T, full protoreflect.FullName) protoreflect.MessageDescriptor {
	t.Helper()
	for _, f := range []protoreflect.FileDescriptor{apiFile, healthFile} {
		if md := f.Messages().ByName(full.Name()); md != nil && md.FullName() == full {
			return md
		}
	}
	t.Fatalf("no message %s in the descriptors", full)
	return nil
}

// Stand-ins for the requests and responses the client encodes or decodes
// from plain values rather than structs of their own.
type (
	getPodRequest     struct{ PodUID string }
	healthRequest     struct{ Service string }
	listPodsRequest   struct{}
	listPodsResponse  struct{ Pods []*Pod }
	removePodResponse struct{ Existed bool }
	healthResponse    struct{ Status ServingStatus }
)

// encoder is how the client writes one request message.
type encoder struct {
	msg     protoreflect.FullName
	goType  reflect.Type // a struct
	marshal func(v any) []byte
	// notSent are the message's fields the plugin leaves to the daemon,
	// each with why.
	notSent map[protoreflect.Name]string
}

var encoders = []encoder{
	{"nftredir.v1.AddPodRequest", reflect.TypeFor[AddPodRequest](), func(v any) []byte { return v.(*AddPodRequest).marshal() },
		map[protoreflect.Name]string{"service_account": "the daemon's Kubernetes mode reads it from the API; a runtime gives a plugin none"}},
	{"nftredir.v1.RedirectOptions", reflect.TypeFor[Options](), func(v any) []byte { return v.(*Options).marshal() },
		map[protoreflect.Name]string{
			"tproxy_ipv4": "where the node proxy listens is the node's (nftredird --tproxy-ipv4); the plugin has no key for it",
			"tproxy_ipv6": "where the node proxy listens is the node's (nftredird --tproxy-ipv6); the plugin has no key for it",
		}},
	{"nftredir.v1.RemovePodRequest", reflect.TypeFor[RemovePodRequest](), func(v any) []byte { return v.(*RemovePodRequest).marshal() }, nil},
	{"nftredir.v1.GetPodRequest", reflect.TypeFor[getPodRequest](), func(v any) []byte { return marshalString(v.(*getPodRequest).PodUID) }, nil},
	{"nftredir.v1.ListPodsRequest", reflect.TypeFor[listPodsRequest](), func(any) []byte { return nil }, nil},
	{"grpc.health.v1.HealthCheckRequest", reflect.TypeFor[healthRequest](), func(v any) []byte { return marshalString(v.(*healthRequest).Service) }, nil},
}

// decoder is how the client reads one response message. Fields it does
// not read are skipped.
type decoder struct {
	msg       protoreflect.FullName
	goType    reflect.Type
	unmarshal func(b []byte) (any, error)
	// paths maps a Go field to a field of a nested message, where the
	// name alone does not say it.
	paths map[string][]protoreflect.Name
}

var decoders = []decoder{
	{"nftredir.v1.Pod", reflect.TypeFor[Pod](), func(b []byte) (any, error) { return unmarshalPod(b) },
		map[string][]protoreflect.Name{"CaptureMode": {"options", "capture_mode"}}},
	{"nftredir.v1.AddPodResponse", reflect.TypeFor[AddPodResponse](), func(b []byte) (any, error) { return unmarshalAddPodResponse(b) }, nil},
	{"nftredir.v1.GetPodResponse", reflect.TypeFor[GetPodResponse](), func(b []byte) (any, error) { return unmarshalGetPodResponse(b) }, nil},
	{"nftredir.v1.ListPodsResponse", reflect.TypeFor[listPodsResponse](), func(b []byte) (any, error) {
		pods, err := unmarshalListPodsResponse(b)
		return &listPodsResponse{pods}, err
	}, nil},
	{"nftredir.v1.RemovePodResponse", reflect.TypeFor[removePodResponse](), func(b []byte) (any, error) {
		v, err := unmarshalVarintField1(b, "RemovePodResponse")
		return &removePodResponse{v != 0}, err
	}, nil},
	{"grpc.health.v1.HealthCheckResponse", reflect.TypeFor[healthResponse](), func(b []byte) (any, error) {
		v, err := unmarshalVarintField1(b, "HealthCheckResponse")
		return &healthResponse{ServingStatus(int32(v))}, err
	}, nil},
}

// protoField is the field of md a Go field stands for: the same name
// without case and underscores (PodUID: pod_uid, IPv6: ipv6).
func protoField(md protoreflect.MessageDescriptor, goName string) protoreflect.FieldDescriptor {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if strings.ReplaceAll(string(fd.Name()), "_", "") == strings.ToLower(goName) {
			return fd
		}
	}
	return nil
}

// protoWireType is how proto3 writes a field: repeated numbers packed.
func protoWireType(fd protoreflect.FieldDescriptor) protowire.Type {
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Uint32Kind,
		protoreflect.Int64Kind, protoreflect.Uint64Kind:
		if fd.IsList() {
			return protowire.BytesType
		}
		return protowire.VarintType
	}
	return -1
}

// samples are values a Go field of the client's messages can be set to,
// each non-zero.
func samples(t *testing.T, f reflect.StructField) []reflect.Value {
	t.Helper()
	v := func(x any) reflect.Value { return reflect.ValueOf(x).Convert(f.Type) }
	switch f.Type {
	case reflect.TypeFor[string]():
		return []reflect.Value{v("v-" + f.Name)}
	case reflect.TypeFor[[]string]():
		return []reflect.Value{v([]string{"a-" + f.Name, "b-" + f.Name})}
	case reflect.TypeFor[[]uint32]():
		return []reflect.Value{v([]uint32{1, 300, 65535})}
	case reflect.TypeFor[bool]():
		return []reflect.Value{v(true)}
	case reflect.TypeFor[*bool]():
		yes, no := true, false
		return []reflect.Value{v(&yes), v(&no)}
	case reflect.TypeFor[CaptureMode]():
		return []reflect.Value{v(CaptureModeTPROXY), v(CaptureModeREDIRECT)}
	case reflect.TypeFor[*Options]():
		return []reflect.Value{v(&Options{})}
	}
	t.Fatalf("field %s: no samples for type %s; add them", f.Name, f.Type)
	return nil
}

// asProto is a sample as the generated code holds it, for comparison.
func asProto(x reflect.Value) string {
	switch x := x.Interface().(type) {
	case *bool:
		return fmt.Sprint(*x)
	case CaptureMode:
		return fmt.Sprint(int32(x))
	case *Options:
		return "{}"
	case []string:
		return fmt.Sprint(x)
	case []uint32:
		return fmt.Sprint(x)
	}
	return fmt.Sprint(x.Interface())
}

func protoValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	switch {
	case fd.IsList():
		l := v.List()
		var parts []string
		for i := range l.Len() {
			parts = append(parts, fmt.Sprint(l.Get(i).Interface()))
		}
		return "[" + strings.Join(parts, " ") + "]"
	case fd.Kind() == protoreflect.EnumKind:
		return fmt.Sprint(int32(v.Enum()))
	case fd.Kind() == protoreflect.MessageKind:
		// The only message the client sends is options, empty here;
		// its fields are RedirectOptions' own case.
		if n := len(v.Message().Interface().ProtoReflect().GetUnknown()); n == 0 && isEmpty(v.Message()) {
			return "{}"
		}
		return "non-empty message"
	}
	return fmt.Sprint(v.Interface())
}

func isEmpty(m protoreflect.Message) bool {
	empty := true
	m.Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool { empty = false; return false })
	return empty
}

// Every field the client sends is written with the descriptor's number
// and wire type, decodes with the generated code to the value meant, and
// nothing else is written with it; every request field of the API is
// either sent or deliberately left out.
func TestEncodersMatchDescriptor(t *testing.T) {
	for _, e := range encoders {
		t.Run(string(e.msg), func(t *testing.T) {
			md := msgDesc(t, e.msg)
			sent := map[protoreflect.Name]bool{}
			for i := range e.goType.NumField() {
				f := e.goType.Field(i)
				fd := protoField(md, f.Name)
				if fd == nil {
					t.Errorf("%s.%s has no field of that name in %s", e.goType.Name(), f.Name, e.msg)
					continue
				}
				sent[fd.Name()] = true
				if why, ok := e.notSent[fd.Name()]; ok {
					t.Errorf("%s is sent (%s.%s) but listed as not sent: %s", fd.FullName(), e.goType.Name(), f.Name, why)
				}
				for _, x := range samples(t, f) {
					v := reflect.New(e.goType)
					v.Elem().Field(i).Set(x)
					b := e.marshal(v.Interface())
					checkWire(t, b, fd, f.Name)
					m := dynamicpb.NewMessage(md)
					if err := proto.Unmarshal(b, m); err != nil {
						t.Errorf("%s = %s: generated code cannot decode % x: %v", f.Name, asProto(x), b, err)
						continue
					}
					m.Range(func(got protoreflect.FieldDescriptor, val protoreflect.Value) bool {
						if got != fd {
							t.Errorf("%s = %s also set %s", f.Name, asProto(x), got.FullName())
						} else if g, w := protoValue(fd, val), asProto(x); g != w {
							t.Errorf("%s = %s decodes as %s = %s", f.Name, w, fd.FullName(), g)
						}
						return true
					})
					if !m.Has(fd) {
						t.Errorf("%s = %s: %s not set in what the generated code decodes from % x", f.Name, asProto(x), fd.FullName(), b)
					}
				}
			}
			fields := md.Fields()
			for i := range fields.Len() {
				fd := fields.Get(i)
				if _, ok := e.notSent[fd.Name()]; !sent[fd.Name()] && !ok {
					t.Errorf("%s (field %d) is neither sent by the plugin nor listed in notSent with a reason", fd.FullName(), fd.Number())
				}
			}
			for name := range e.notSent {
				if fields.ByName(name) == nil {
					t.Errorf("notSent lists %s, which %s does not have", name, e.msg)
				}
			}
		})
	}
}

// checkWire reads b as the wire format and requires every field in it to
// be fd's number with fd's wire type.
func checkWire(t *testing.T, b []byte, fd protoreflect.FieldDescriptor, goName string) {
	t.Helper()
	if len(b) == 0 {
		t.Errorf("%s: a non-zero value wrote nothing", goName)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Errorf("%s: bad tag: %v", goName, protowire.ParseError(n))
			return
		}
		if num != fd.Number() || typ != protoWireType(fd) {
			t.Errorf("%s: written as field %d wire type %d; %s is field %d, wire type %d", goName, num, typ, fd.FullName(), fd.Number(), protoWireType(fd))
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Errorf("%s: bad value: %v", goName, protowire.ParseError(m))
			return
		}
		b = b[m:]
	}
}

// fill sets fd of m to a non-zero value, the same for one name each time:
// strings are "v-" and the field's name, enums their last value, nested
// messages carry their first string field.
func fill(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	scalar := func() protoreflect.Value {
		switch fd.Kind() {
		case protoreflect.StringKind:
			return protoreflect.ValueOfString("v-" + string(fd.Name()))
		case protoreflect.BoolKind:
			return protoreflect.ValueOfBool(true)
		case protoreflect.EnumKind:
			vals := fd.Enum().Values()
			return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
		case protoreflect.Uint32Kind:
			return protoreflect.ValueOfUint32(7)
		case protoreflect.Int32Kind:
			return protoreflect.ValueOfInt32(7)
		case protoreflect.Int64Kind:
			return protoreflect.ValueOfInt64(7)
		case protoreflect.MessageKind:
			nested := m.NewField(fd)
			if fd.IsList() {
				nested = m.Mutable(fd).List().NewElement()
			}
			fs := fd.Message().Fields()
			for i := range fs.Len() {
				if f := fs.Get(i); f.Kind() == protoreflect.StringKind && !f.IsList() {
					fill(nested.Message(), f)
					break
				}
			}
			return nested
		}
		panic(fmt.Sprintf("fill: kind %s of %s", fd.Kind(), fd.FullName()))
	}
	if fd.IsList() {
		l := m.Mutable(fd).List()
		l.Append(scalar())
		l.Append(scalar())
		return
	}
	m.Set(fd, scalar())
}

// want is what the Go field must read after its proto field was filled.
func want(fd protoreflect.FieldDescriptor, goType reflect.Type) any {
	switch {
	case fd.Kind() == protoreflect.StringKind && fd.IsList():
		s := "v-" + string(fd.Name())
		return []string{s, s}
	case fd.Kind() == protoreflect.StringKind:
		return "v-" + string(fd.Name())
	case fd.Kind() == protoreflect.BoolKind:
		return true
	case fd.Kind() == protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return reflect.ValueOf(int32(vals.Get(vals.Len() - 1).Number())).Convert(goType).Interface()
	}
	return nil
}

// Every field the client reads comes from the descriptor's number with
// its wire type: set alone in a message the generated code wrote, it
// lands in that Go field and in no other, and fields the client does not
// read leave its result untouched.
func TestDecodersMatchDescriptor(t *testing.T) {
	for _, d := range decoders {
		t.Run(string(d.msg), func(t *testing.T) {
			md := msgDesc(t, d.msg)
			read := map[protoreflect.FieldNumber]bool{}
			for i := range d.goType.NumField() {
				f := d.goType.Field(i)
				m := dynamicpb.NewMessage(md)
				var fd protoreflect.FieldDescriptor
				if path, ok := d.paths[f.Name]; ok {
					outer := md.Fields().ByName(path[0])
					if outer == nil || outer.Message() == nil || outer.Message().Fields().ByName(path[1]) == nil {
						t.Fatalf("%s.%s: no field %s.%s in %s", d.goType.Name(), f.Name, path[0], path[1], d.msg)
					}
					read[outer.Number()] = true
					fd = outer.Message().Fields().ByName(path[1])
					nested := m.NewField(outer)
					fill(nested.Message(), fd)
					m.Set(outer, nested)
				} else {
					fd = protoField(md, f.Name)
					if fd == nil {
						t.Errorf("%s.%s has no field of that name in %s", d.goType.Name(), f.Name, d.msg)
						continue
					}
					read[fd.Number()] = true
					fill(m, fd)
				}
				b, err := proto.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				got, err := d.unmarshal(b)
				if err != nil {
					t.Errorf("%s.%s: decoding % x: %v", d.goType.Name(), f.Name, b, err)
					continue
				}
				gv := reflect.ValueOf(got).Elem()
				for j := range d.goType.NumField() {
					other := gv.Field(j)
					if j != i {
						if !other.IsZero() {
							t.Errorf("%s alone set %s.%s = %v", fd.FullName(), d.goType.Name(), d.goType.Field(j).Name, other.Interface())
						}
						continue
					}
					checkRead(t, fd, other, d.goType.Name()+"."+f.Name)
				}
			}

			// Every other field, set: skipped, as any decoder skips
			// fields it does not know.
			m := dynamicpb.NewMessage(md)
			fields := md.Fields()
			for i := range fields.Len() {
				if fd := fields.Get(i); !read[fd.Number()] {
					fill(m, fd)
				}
			}
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.unmarshal(b)
			if err != nil || !reflect.ValueOf(got).Elem().IsZero() {
				t.Errorf("fields the client does not read: decoded %+v, %v; want nothing", got, err)
			}
		})
	}
}

// checkRead compares a decoded Go field with what fill wrote to fd.
func checkRead(t *testing.T, fd protoreflect.FieldDescriptor, got reflect.Value, what string) {
	t.Helper()
	if fd.Kind() == protoreflect.MessageKind {
		// fill's nested Pods carry pod_uid "v-pod_uid".
		var pods []*Pod
		switch p := got.Interface().(type) {
		case *Pod:
			pods = []*Pod{p}
		case []*Pod:
			pods = p
		default:
			t.Errorf("%s: message field %s read into %s", what, fd.FullName(), got.Type())
			return
		}
		wantN := 1
		if fd.IsList() {
			wantN = 2
		}
		if len(pods) != wantN || slices.ContainsFunc(pods, func(p *Pod) bool { return p == nil || p.PodUID != "v-pod_uid" }) {
			t.Errorf("%s: %s decoded as %+v; want %d pod(s) with uid v-pod_uid", what, fd.FullName(), pods, wantN)
		}
		return
	}
	if w := want(fd, got.Type()); !reflect.DeepEqual(got.Interface(), w) {
		t.Errorf("%s = %#v; %s was %#v", what, got.Interface(), fd.FullName(), w)
	}
}

// The paths the client calls are methods of the services, taking the
// messages its encoders write and returning those its decoders read.
func TestMethodsMatchDescriptor(t *testing.T) {
	enc := map[protoreflect.FullName]bool{}
	for _, e := range encoders {
		enc[e.msg] = true
	}
	dec := map[protoreflect.FullName]bool{}
	for _, d := range decoders {
		dec[d.msg] = true
	}
	for _, path := range []string{methodAddPod, methodRemovePod, methodGetPod, methodListPods, methodHealth} {
		service, method, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
		if !ok {
			t.Errorf("%s is not /service/method", path)
			continue
		}
		var md protoreflect.MethodDescriptor
		for _, f := range []protoreflect.FileDescriptor{apiFile, healthFile} {
			if sd := f.Services().ByName(protoreflect.FullName(service).Name()); sd != nil && sd.FullName() == protoreflect.FullName(service) {
				md = sd.Methods().ByName(protoreflect.Name(method))
			}
		}
		if md == nil {
			t.Errorf("%s: no such method", path)
			continue
		}
		if md.IsStreamingClient() || md.IsStreamingServer() {
			t.Errorf("%s streams; the client makes unary calls only", path)
		}
		if !enc[md.Input().FullName()] {
			t.Errorf("%s takes %s, which no encoder here writes", path, md.Input().FullName())
		}
		if !dec[md.Output().FullName()] {
			t.Errorf("%s returns %s, which no decoder here reads", path, md.Output().FullName())
		}
	}
}
