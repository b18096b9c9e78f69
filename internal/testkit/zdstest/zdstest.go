// Package zdstest is a node proxy's end of ZDS for tests: it connects to
// a ZDS socket, says hello, and reads what the node agent sends, fds
// included. It is written from the protocol description alone: messages
// are encoded and decoded by hand with protowire, not with the generated
// types the daemon uses, so a wrong field number on either side shows up.
//
//	ZdsHello         { Version version = 1 }              (V1 = 1)
//	WorkloadRequest  { oneof: AddWorkload add = 1; DelWorkload del = 2;
//	                   SnapshotSent snapshot_sent = 3; KeepWorkload keep = 5 }
//	AddWorkload      { string uid = 1; WorkloadInfo workload_info = 2 }
//	WorkloadInfo     { string name = 1; namespace = 2; service_account = 3 }
//	KeepWorkload     { string uid = 1 }
//	DelWorkload      { string uid = 2 }
//	WorkloadResponse { oneof: Ack ack = 1 }
//	Ack              { string error = 1 }
//
// One message per SOCK_SEQPACKET packet; an AddWorkload packet carries
// exactly one namespace fd (SCM_RIGHTS); the proxy answers every request
// with one Ack, in order.
package zdstest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// Kinds of request.
const (
	Add          = "add"
	Del          = "del"
	Keep         = "keep"
	SnapshotSent = "snapshot_sent"
)

// DefaultTimeout bounds each wait for a request.
const DefaultTimeout = 5 * time.Second

// ErrClosed: the agent closed the connection.
var ErrClosed = errors.New("connection closed by the node agent")

// Request is one message from the node agent.
type Request struct {
	Kind                                 string
	UID, Name, Namespace, ServiceAccount string
	// Fds came with the packet; Next closes them when the test ends.
	Fds []int
}

func (r Request) String() string {
	return fmt.Sprintf("%s %s (%d fds)", r.Kind, r.UID, len(r.Fds))
}

// Peer is one proxy connection.
type Peer struct {
	t testing.TB
	c *net.UnixConn
}

// Dial connects to the agent's socket; the connection is closed when the
// test ends.
func Dial(t testing.TB, path string) *Peer {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatalf("connect to %s: %v", path, err)
	}
	p := &Peer{t: t, c: c}
	t.Cleanup(func() { c.Close() })
	return p
}

// Connect is Dial that returns its error instead of failing the test,
// for proxies run on goroutines of their own (where t.Fatal must not be
// called). The connection is closed when the test ends.
func Connect(t testing.TB, path string) (*Peer, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return &Peer{t: t, c: c}, nil
}

// Write sends one packet and returns the error, for the same proxies.
func (p *Peer) Write(raw []byte) error {
	_, err := p.c.Write(raw)
	return err
}

// AckMsg encodes WorkloadResponse{ack: Ack{error: errMsg}}.
func AckMsg(errMsg string) []byte {
	var ack []byte
	if errMsg != "" {
		ack = protowire.AppendTag(ack, 1, protowire.BytesType)
		ack = protowire.AppendString(ack, errMsg)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(b, ack)
}

// CloseFds closes the fds a request brought, for callers of Recv.
func CloseFds(r Request) { closeFds(r.Fds) }

// Close hangs up, as a proxy that exits does.
func (p *Peer) Close() { p.c.Close() }

// Send writes one packet as it is, for tests that speak out of turn or
// send what is not a message at all.
func (p *Peer) Send(raw []byte) {
	p.t.Helper()
	if _, err := p.c.Write(raw); err != nil {
		p.t.Fatalf("zds peer send: %v", err)
	}
}

// HelloMsg encodes ZdsHello{version}; V1 is 1, and the agent refuses any
// other.
func HelloMsg(version uint64) []byte {
	b := protowire.AppendTag(nil, 1, protowire.VarintType)
	return protowire.AppendVarint(b, version)
}

// Hello sends ZdsHello{version: V1}.
func (p *Peer) Hello() {
	p.t.Helper()
	p.Send(HelloMsg(1))
}

// Ack answers the last request; a non-empty errMsg is a NACK.
func (p *Peer) Ack(errMsg string) {
	p.t.Helper()
	p.Send(AckMsg(errMsg))
}

// Recv reads one request with any fds that came with it; the caller owns
// the fds.
func (p *Peer) Recv(timeout time.Duration) (Request, error) {
	p.c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1024)
	oob := make([]byte, unix.CmsgSpace(4*8))
	n, oobn, flags, _, err := p.c.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return Request{}, ErrClosed
	}
	if err != nil {
		return Request{}, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return Request{}, err
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				return Request{}, err
			}
			fds = append(fds, got...)
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFds(fds)
		return Request{}, errors.New("truncated packet")
	}
	if n == 0 {
		closeFds(fds)
		return Request{}, ErrClosed
	}
	r, err := decodeRequest(buf[:n])
	if err != nil {
		closeFds(fds)
		return Request{}, err
	}
	r.Fds = fds
	return r, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Next reads one request and fails the test on error; its fds are closed
// when the test ends.
func (p *Peer) Next() Request {
	p.t.Helper()
	r, err := p.Recv(DefaultTimeout)
	if err != nil {
		p.t.Fatalf("zds peer: waiting for a request: %v", err)
	}
	p.t.Cleanup(func() { closeFds(r.Fds) })
	return r
}

// Expect reads one request and checks its kind, uid, and that an add
// carries exactly one fd and nothing else carries any.
func (p *Peer) Expect(kind, uid string) Request {
	p.t.Helper()
	r := p.Next()
	if r.Kind != kind || r.UID != uid {
		p.t.Fatalf("zds peer got %v, want %s %s", r, kind, uid)
	}
	want := 0
	if kind == Add {
		want = 1
	}
	if len(r.Fds) != want {
		p.t.Fatalf("zds peer got %v with %d fds, want %d", r, len(r.Fds), want)
	}
	return r
}

// ExpectQuiet checks that nothing arrives for d.
func (p *Peer) ExpectQuiet(d time.Duration) {
	p.t.Helper()
	r, err := p.Recv(d)
	if err == nil {
		closeFds(r.Fds)
		p.t.Fatalf("zds peer got %v, want nothing", r)
	}
	if errors.Is(err, ErrClosed) {
		p.t.Fatalf("zds peer: connection closed, want it open and quiet")
	}
}

// ExpectClosed checks that the agent closes the connection within
// timeout, with nothing sent before.
func (p *Peer) ExpectClosed(timeout time.Duration) {
	p.t.Helper()
	r, err := p.Recv(timeout)
	if err == nil {
		closeFds(r.Fds)
		p.t.Fatalf("zds peer got %v, want the connection closed", r)
	}
	if !errors.Is(err, ErrClosed) && !errors.Is(err, unix.ECONNRESET) {
		p.t.Fatalf("zds peer: want the connection closed, got %v", err)
	}
}

// Handshake says hello and acks the whole snapshot, returning its
// requests without the final snapshot_sent.
func (p *Peer) Handshake() []Request {
	p.t.Helper()
	p.Hello()
	var snap []Request
	for {
		r := p.Next()
		p.Ack("")
		if r.Kind == SnapshotSent {
			return snap
		}
		snap = append(snap, r)
	}
}

// NetnsOf returns the device and inode of the network namespace a
// received fd refers to, and fails the test if it is not one: the pair
// stat(2) gives for the namespace's path, and netns.ID's Dev and Ino.
func NetnsOf(t testing.TB, fd int) (dev, ino uint64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatalf("fstat received fd: %v", err)
	}
	nstype, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil || nstype != unix.CLONE_NEWNET {
		t.Fatalf("received fd is not a network namespace (type %#x, %v)", nstype, err)
	}
	return st.Dev, st.Ino
}

func decodeRequest(b []byte) (Request, error) {
	var r Request
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			r.Kind = Add
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					r.UID = string(v)
				case num == 2 && typ == protowire.BytesType:
					return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
						if typ != protowire.BytesType {
							return nil
						}
						switch num {
						case 1:
							r.Name = string(v)
						case 2:
							r.Namespace = string(v)
						case 3:
							r.ServiceAccount = string(v)
						}
						return nil
					})
				}
				return nil
			})
		case 2:
			r.Kind = Del
			return stringField(v, 2, &r.UID)
		case 3:
			r.Kind = SnapshotSent
		case 5:
			r.Kind = Keep
			return stringField(v, 1, &r.UID)
		}
		return nil
	})
	if err == nil && r.Kind == "" {
		err = fmt.Errorf("request %x has no known payload", b)
	}
	return r, err
}

func stringField(b []byte, want protowire.Number, out *string) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num == want && typ == protowire.BytesType {
			*out = string(v)
		}
		return nil
	})
}

// fields walks a message, handing each field's number, type and (for
// length-delimited fields) contents to fn.
func fields(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// Probe is a would-be proxy for tests that need one running as another
// uid (in a child process): it connects to path, says hello, acks
// everything for d, and describes what it got as "packets=N fds=F
// closed=C" (C is 1 when the agent closed the connection), or "dial: ..."
// when it could not connect.
func Probe(path string, d time.Duration) string {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Sprintf("dial: %v", err)
	}
	defer c.Close()
	c.Write(HelloMsg(1))
	packets, fds, closed := 0, 0, 0
	deadline := time.Now().Add(d)
	ack := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)
	for {
		c.SetReadDeadline(deadline)
		buf, oob := make([]byte, 1024), make([]byte, unix.CmsgSpace(4*8))
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			if err == nil || errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET) {
				closed = 1
			}
			break
		}
		packets++
		if oobn > 0 {
			fds++
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					got, _ := unix.ParseUnixRights(&m)
					closeFds(got)
				}
			}
		}
		c.Write(ack)
	}
	return fmt.Sprintf("packets=%d fds=%d closed=%d", packets, fds, closed)
}
