package zds_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/nftredir/nftredir/netns"
)

// peer is a node proxy written from the protocol description alone: the
// messages are encoded and decoded by hand with protowire, not with the
// generated types the server uses, so a wrong field number on either side
// shows up here.
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
type peer struct {
	t *testing.T
	c *net.UnixConn
}

func dialPeer(t *testing.T, path string) *peer {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatalf("connect to %s: %v", path, err)
	}
	p := &peer{t: t, c: c}
	t.Cleanup(func() { c.Close() })
	return p
}

func (p *peer) send(b []byte) {
	p.t.Helper()
	if _, err := p.c.Write(b); err != nil {
		p.t.Fatalf("peer send: %v", err)
	}
}

func helloMsg(version uint64) []byte {
	b := protowire.AppendTag(nil, 1, protowire.VarintType)
	return protowire.AppendVarint(b, version)
}

func (p *peer) hello() { p.t.Helper(); p.send(helloMsg(1)) }

func ackMsg(errMsg string) []byte {
	var ack []byte
	if errMsg != "" {
		ack = protowire.AppendTag(ack, 1, protowire.BytesType)
		ack = protowire.AppendString(ack, errMsg)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(b, ack)
}

// ack answers the last request; a non-empty errMsg is a NACK.
func (p *peer) ack(errMsg string) { p.t.Helper(); p.send(ackMsg(errMsg)) }

type request struct {
	kind                             string // add, keep, del, snapshot_sent
	uid, name, namespace, svcAccount string
	fds                              []int
}

func (r request) String() string {
	return fmt.Sprintf("%s %s (%d fds)", r.kind, r.uid, len(r.fds))
}

// recv reads one request, with any fds that came with it.
func (p *peer) recv(timeout time.Duration) (request, error) {
	p.c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1024)
	oob := make([]byte, unix.CmsgSpace(4*8))
	n, oobn, flags, _, err := p.c.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return request{}, errEOF
	}
	if err != nil {
		return request{}, err
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return request{}, errors.New("truncated packet")
	}
	if n == 0 {
		return request{}, errEOF
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return request{}, err
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				return request{}, err
			}
			fds = append(fds, got...)
		}
	}
	r, err := decodeRequest(buf[:n])
	r.fds = fds
	if err != nil {
		p.closeFds(r)
		return request{}, err
	}
	return r, nil
}

var errEOF = errors.New("connection closed by the server")

func (p *peer) closeFds(r request) {
	for _, fd := range r.fds {
		unix.Close(fd)
	}
}

// next reads one request and fails the test on error; its fds are closed
// when the test ends.
func (p *peer) next() request {
	p.t.Helper()
	r, err := p.recv(5 * time.Second)
	if err != nil {
		p.t.Fatalf("peer: waiting for a request: %v", err)
	}
	p.t.Cleanup(func() { p.closeFds(r) })
	return r
}

// expect reads one request and checks its kind and uid.
func (p *peer) expect(kind, uid string) request {
	p.t.Helper()
	r := p.next()
	if r.kind != kind || r.uid != uid {
		p.t.Fatalf("peer got %v, want %s %s", r, kind, uid)
	}
	wantFds := 0
	if kind == "add" {
		wantFds = 1
	}
	if len(r.fds) != wantFds {
		p.t.Fatalf("peer got %v with %d fds, want %d", r, len(r.fds), wantFds)
	}
	return r
}

// expectClosed waits for the server to close the connection.
func (p *peer) expectClosed(timeout time.Duration) {
	p.t.Helper()
	r, err := p.recv(timeout)
	if err == nil {
		p.closeFds(r)
		p.t.Fatalf("peer got %v, want the connection closed", r)
	}
	if !errors.Is(err, errEOF) && !errors.Is(err, unix.ECONNRESET) {
		p.t.Fatalf("peer: want the connection closed, got %v", err)
	}
}

// expectQuiet checks nothing arrives for a while: the negative half of
// "this peer was not sent that".
func (p *peer) expectQuiet(d time.Duration) {
	p.t.Helper()
	r, err := p.recv(d)
	if err == nil {
		p.closeFds(r)
		p.t.Fatalf("peer got %v, want nothing", r)
	}
}

// handshake says hello and acks the whole snapshot, returning its
// requests (without the final snapshot_sent).
func (p *peer) handshake() []request {
	p.t.Helper()
	p.hello()
	var snap []request
	for {
		r := p.next()
		p.ack("")
		if r.kind == "snapshot_sent" {
			return snap
		}
		snap = append(snap, r)
	}
}

// fdNetnsID is the identity of the namespace a received fd refers to.
func fdNetnsID(t *testing.T, fd int) netns.ID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatalf("fstat received fd: %v", err)
	}
	nstype, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil || nstype != unix.CLONE_NEWNET {
		t.Fatalf("received fd is not a network namespace (type %#x, %v)", nstype, err)
	}
	return netns.ID{Dev: st.Dev, Ino: st.Ino}
}

func decodeRequest(b []byte) (request, error) {
	var r request
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			r.kind = "add"
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					r.uid = string(v)
				case num == 2 && typ == protowire.BytesType:
					return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
						switch num {
						case 1:
							r.name = string(v)
						case 2:
							r.namespace = string(v)
						case 3:
							r.svcAccount = string(v)
						}
						return nil
					})
				}
				return nil
			})
		case 2:
			r.kind = "del"
			return stringField(v, 2, &r.uid)
		case 3:
			r.kind = "snapshot_sent"
		case 5:
			r.kind = "keep"
			return stringField(v, 1, &r.uid)
		}
		return nil
	})
	if err == nil && r.kind == "" {
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
