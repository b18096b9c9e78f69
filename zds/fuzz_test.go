package zds

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	zdspb "github.com/nftredir/nftredir/proto/istio/workload/zds"
)

// seqpacketPair is a connected SOCK_SEQPACKET pair: the agent's end as
// the server reads it, and the raw fd of the proxy's end.
func seqpacketPair(f *testing.F) (*net.UnixConn, int) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		f.Fatal(err)
	}
	file := os.NewFile(uintptr(fds[0]), "agent")
	c, err := net.FileConn(file)
	file.Close()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close(); unix.Close(fds[1]) })
	return c.(*net.UnixConn), fds[1]
}

// FuzzWire sends arbitrary packets from the proxy's side of a real
// SOCK_SEQPACKET pair and reads them as a hello and as an ack. Each read
// yields a valid message or a protocol error (or EOF for an empty
// packet), never anything else, and what is accepted decodes as such.
func FuzzWire(f *testing.F) {
	for _, m := range []proto.Message{
		&zdspb.ZdsHello{Version: zdspb.Version_V1},
		&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{}}},
		&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: "failure to start proxy"}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	agent, proxy := seqpacketPair(f)
	send := func(t *testing.T, data []byte) {
		if err := unix.Sendmsg(proxy, data, nil, nil, 0); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	expected := func(t *testing.T, what string, err error) {
		if !errors.Is(err, errProtocol) && !errors.Is(err, io.EOF) {
			t.Fatalf("%s: error %v is neither a protocol error nor EOF", what, err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		send(t, data)
		if err := readHello(agent, time.Second); err != nil {
			expected(t, "hello", err)
		} else {
			var h zdspb.ZdsHello
			if proto.Unmarshal(data, &h) != nil || h.GetVersion() != zdspb.Version_V1 {
				t.Fatalf("accepted hello %x is not a V1 hello", data)
			}
		}
		send(t, data)
		nack, err := readAck(agent, time.Second)
		if err != nil {
			expected(t, "ack", err)
			return
		}
		var r zdspb.WorkloadResponse
		if proto.Unmarshal(data, &r) != nil || r.GetAck() == nil || r.GetAck().GetError() != nack {
			t.Fatalf("accepted ack %x (nack %q) does not decode as one", data, nack)
		}
	})
}

// FuzzEncodeRequest: whatever a pod is called, its AddWorkload either
// fits one packet and decodes back to the same pod, or is refused as
// unsendable (too large, or not UTF-8), which settles that pod alone
// instead of dropping the connection; nothing is truncated.
func FuzzEncodeRequest(f *testing.F) {
	f.Add("7d0f0c1e-1", "web-0", "shop", "web")
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, uid, name, namespace, sa string) {
		data, err := encode(addRequest(Pod{UID: uid, Name: name, Namespace: namespace, ServiceAccount: sa}))
		if err != nil {
			if !errors.Is(err, errUnsendable) {
				t.Fatalf("refused with %v, which would drop the connection", err)
			}
			return
		}
		if len(data) > maxPacket {
			t.Fatalf("encoded %d bytes, more than a packet", len(data))
		}
		var r zdspb.WorkloadRequest
		if err := proto.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		a := r.GetAdd()
		if a.GetUid() != uid || a.GetWorkloadInfo().GetName() != name || a.GetWorkloadInfo().GetNamespace() != namespace || a.GetWorkloadInfo().GetServiceAccount() != sa {
			t.Fatalf("round trip changed the pod: %v", a)
		}
	})
}
