package zds

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	zdspb "github.com/nftredir/nftredir/proto/istio/workload/zds"
)

// maxPacket is the receive buffer ztunnel uses: a longer packet would be
// truncated there and refused, so none is sent, and none is accepted.
const maxPacket = 1024

// errProtocol marks a peer that broke the protocol; its connection is
// dropped.
var errProtocol = errors.New("zds protocol error")

// errUnsendable marks a request that cannot be sent: it would not fit
// the peer's buffer, or cannot be marshalled. Only that pod is affected;
// the connection goes on.
var errUnsendable = errors.New("request cannot be sent over ZDS")

func addRequest(p Pod) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{
		Uid: p.UID,
		WorkloadInfo: &zdspb.WorkloadInfo{
			Name:           p.Name,
			Namespace:      p.Namespace,
			ServiceAccount: p.ServiceAccount,
		},
	}}}
}

func keepRequest(uid string) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{Uid: uid}}}
}

func delRequest(uid string) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: uid}}}
}

func snapshotSentRequest() *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}
}

// encode marshals a request and checks it fits one packet.
func encode(req *zdspb.WorkloadRequest) ([]byte, error) {
	data, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: marshal: %v", errUnsendable, err)
	}
	if len(data) > maxPacket {
		return nil, fmt.Errorf("%w: %d bytes, larger than a packet (at most %d)", errUnsendable, len(data), maxPacket)
	}
	return data, nil
}

// writePacket sends one message, with fd attached when fd >= 0.
func writePacket(uc *net.UnixConn, data []byte, fd int, timeout time.Duration) error {
	if err := uc.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	n, oobn, err := uc.WriteMsgUnix(data, oob, nil)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if n != len(data) || oobn != len(oob) {
		return fmt.Errorf("send: short write (%d of %d bytes, %d of %d control bytes)", n, len(data), oobn, len(oob))
	}
	return nil
}

// readPacket reads one message. A peer that closed yields io.EOF, an idle
// one os.ErrDeadlineExceeded. Any fd the peer attached is closed and is a
// protocol error, as is a truncated message.
func readPacket(uc *net.UnixConn, timeout time.Duration) ([]byte, error) {
	if err := uc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	buf := make([]byte, maxPacket)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, os.ErrDeadlineExceeded
		}
		return nil, fmt.Errorf("receive: %w", err)
	}
	if oobn > 0 {
		closeRights(oob[:oobn])
		return nil, fmt.Errorf("%w: the peer sent ancillary data", errProtocol)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("%w: message longer than %d bytes", errProtocol, maxPacket)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return nil, fmt.Errorf("%w: truncated control data", errProtocol)
	}
	if n == 0 {
		// An orderly shutdown; no valid message is empty.
		return nil, io.EOF
	}
	return buf[:n], nil
}

func closeRights(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// readHello reads the proxy's first packet, which must be a V1 hello.
func readHello(uc *net.UnixConn, timeout time.Duration) error {
	data, err := readPacket(uc, timeout)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("no hello within %s", timeout)
		}
		return err
	}
	var hello zdspb.ZdsHello
	if err := proto.Unmarshal(data, &hello); err != nil {
		return fmt.Errorf("%w: hello: %v", errProtocol, err)
	}
	if hello.GetVersion() != zdspb.Version_V1 {
		return fmt.Errorf("%w: hello with version %v, this server speaks V1", errProtocol, hello.GetVersion())
	}
	return nil
}

// readAck reads the response to the last request and returns the NACK
// message, empty for an ack.
func readAck(uc *net.UnixConn, timeout time.Duration) (string, error) {
	data, err := readPacket(uc, timeout)
	if err != nil {
		return "", err
	}
	var resp zdspb.WorkloadResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return "", fmt.Errorf("%w: response: %v", errProtocol, err)
	}
	ack := resp.GetAck()
	if ack == nil {
		return "", fmt.Errorf("%w: response without an ack", errProtocol)
	}
	return ack.GetError(), nil
}
