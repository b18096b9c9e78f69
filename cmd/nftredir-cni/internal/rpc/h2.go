package rpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"golang.org/x/net/http2/hpack"
)

// What this file speaks is the part of HTTP/2 (RFC 9113) that a gRPC
// unary call over plain text needs, one call at a time: the preface and
// SETTINGS, one stream per call (HEADERS, DATA, trailing HEADERS),
// flow control for what it sends, PING and SETTINGS acknowledgements,
// GOAWAY and RST_STREAM. It receives with windows so large that it never
// has to grant more. grpc-go's server is the only peer it is meant for.

const (
	clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingHeaderTableSize   = 0x1
	settingEnablePush        = 0x2
	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5

	// defaultWindow and defaultMaxFrame are HTTP/2's initial values.
	defaultWindow   = 65535
	defaultMaxFrame = 16384
	// recvWindow is what the client grants the server, per stream and for
	// the connection, once: more than any response it accepts, and more
	// than the few calls of one plugin command ever read, so it never has
	// to grant more.
	recvWindow = 1 << 30

	// MaxResponse bounds a response message. grpc-go's client default is
	// 4 MiB; ListPods of a node with many thousand pods can be larger.
	MaxResponse = 64 << 20
)

// conn is one HTTP/2 connection to the daemon.
type conn struct {
	nc  net.Conn
	r   *bufio.Reader
	enc *hpack.Encoder
	hb  bytes.Buffer // the encoder's output
	dec *hpack.Decoder

	nextStream uint32
	// Send windows: the connection's, and the initial window of a new
	// stream as the server's SETTINGS set it.
	connSend    int64
	streamInit  int64
	maxFrame    int
	goneAway    bool
	lastStream  uint32 // GOAWAY's last stream id
	streamWin   int64  // the current call's stream send window
	curStream   uint32
	settingsAck bool
}

func dial(ctx context.Context, socket string) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, &Error{Code: Unavailable, Message: "connection error: " + err.Error(), cause: err}
	}
	c := &conn{
		nc:         nc,
		r:          bufio.NewReaderSize(nc, 32<<10),
		dec:        hpack.NewDecoder(4096, nil),
		nextStream: 1,
		connSend:   defaultWindow,
		streamInit: defaultWindow,
		maxFrame:   defaultMaxFrame,
	}
	c.enc = hpack.NewEncoder(&c.hb)
	// The preface, our SETTINGS and the connection window in one write;
	// the server's SETTINGS are read with the first response.
	var b []byte
	b = append(b, clientPreface...)
	settings := []byte{}
	settings = appendSetting(settings, settingEnablePush, 0)
	settings = appendSetting(settings, settingInitialWindowSize, recvWindow)
	b = appendFrame(b, frameSettings, 0, 0, settings)
	b = appendFrame(b, frameWindowUpdate, 0, 0, binary.BigEndian.AppendUint32(nil, recvWindow-defaultWindow))
	if err := c.write(b); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *conn) close() { c.nc.Close() }

// usable reports whether another call may use the connection.
func (c *conn) usable() bool { return !c.goneAway && c.nextStream < 1<<31-1 }

func appendSetting(b []byte, id uint16, v uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, id)
	return binary.BigEndian.AppendUint32(b, v)
}

func appendFrame(b []byte, typ, flags byte, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = binary.BigEndian.AppendUint32(b, stream&(1<<31-1))
	return append(b, payload...)
}

func (c *conn) write(b []byte) error {
	if _, err := c.nc.Write(b); err != nil {
		return transportErr("write", err)
	}
	return nil
}

// transportErr is a failure of the connection itself. The daemon may not
// have got, or not have answered, the call: Unavailable, which every
// caller may retry because every call of the API is idempotent (grpc-go
// says Unavailable too).
func transportErr(what string, err error) *Error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &Error{Code: Unavailable, Message: "connection closed by nftredird while " + what + "ing", cause: err}
	}
	return &Error{Code: Unavailable, Message: "connection error while " + what + "ing: " + err.Error(), cause: err}
}

type frame struct {
	typ, flags byte
	stream     uint32
	payload    []byte
}

func (c *conn) readFrame() (frame, error) {
	var h [9]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return frame{}, transportErr("read", err)
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	if n > defaultMaxFrame {
		// We never raise SETTINGS_MAX_FRAME_SIZE.
		return frame{}, errorf(Internal, fmt.Sprintf("http2: server sent a frame of %d bytes, more than the %d allowed", n, defaultMaxFrame))
	}
	f := frame{typ: h[3], flags: h[4], stream: binary.BigEndian.Uint32(h[5:]) & (1<<31 - 1), payload: make([]byte, n)}
	if _, err := io.ReadFull(c.r, f.payload); err != nil {
		return frame{}, transportErr("read", err)
	}
	return f, nil
}

// unpad strips a PADDED frame's padding.
func unpad(f frame) ([]byte, error) {
	p := f.payload
	if f.flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, errorf(Internal, "http2: malformed padding")
	}
	return p[1 : len(p)-int(p[0])], nil
}

// control handles a frame that is about the connection, not the call's
// stream. It returns an error only for a connection that cannot go on.
func (c *conn) control(f frame) error {
	switch f.typ {
	case frameSettings:
		if f.flags&flagAck != 0 {
			c.settingsAck = true
			return nil
		}
		if len(f.payload)%6 != 0 {
			return errorf(Internal, "http2: malformed SETTINGS")
		}
		for p := f.payload; len(p) > 0; p = p[6:] {
			id, v := binary.BigEndian.Uint16(p), binary.BigEndian.Uint32(p[2:])
			switch id {
			case settingInitialWindowSize:
				// Applies to open streams as a delta (RFC 9113 §6.9.2).
				if c.curStream != 0 {
					c.streamWin += int64(v) - c.streamInit
				}
				c.streamInit = int64(v)
			case settingMaxFrameSize:
				c.maxFrame = int(v)
			}
		}
		return c.write(appendFrame(nil, frameSettings, flagAck, 0, nil))
	case framePing:
		if f.flags&flagAck == 0 {
			return c.write(appendFrame(nil, framePing, flagAck, 0, f.payload))
		}
	case frameWindowUpdate:
		if len(f.payload) != 4 {
			return errorf(Internal, "http2: malformed WINDOW_UPDATE")
		}
		inc := int64(binary.BigEndian.Uint32(f.payload) & (1<<31 - 1))
		switch f.stream {
		case 0:
			c.connSend += inc
		case c.curStream:
			c.streamWin += inc
		}
	case frameGoAway:
		if len(f.payload) < 8 {
			return errorf(Internal, "http2: malformed GOAWAY")
		}
		c.goneAway = true
		c.lastStream = binary.BigEndian.Uint32(f.payload) & (1<<31 - 1)
	}
	// PRIORITY, PUSH_PROMISE (refused by our SETTINGS) and unknown frames
	// are ignored, as RFC 9113 asks for unknown ones.
	return nil
}

// headerBlock reads the rest of a header block that f starts, through its
// CONTINUATION frames, and decodes it.
func (c *conn) headerBlock(f frame) ([]hpack.HeaderField, error) {
	p, err := unpad(f)
	if err != nil {
		return nil, err
	}
	if f.flags&flagPriority != 0 {
		if len(p) < 5 {
			return nil, errorf(Internal, "http2: malformed HEADERS")
		}
		p = p[5:]
	}
	block := append([]byte(nil), p...)
	for end := f.flags&flagEndHeaders != 0; !end; {
		cf, err := c.readFrame()
		if err != nil {
			return nil, err
		}
		if cf.typ != frameContinuation || cf.stream != f.stream {
			return nil, errorf(Internal, "http2: header block not continued")
		}
		block = append(block, cf.payload...)
		end = cf.flags&flagEndHeaders != 0
	}
	fields, err := c.dec.DecodeFull(block)
	if err != nil {
		return nil, errorf(Internal, "http2: "+err.Error())
	}
	return fields, nil
}

// grpcTimeout is a deadline as the grpc-timeout header says it: at most
// eight digits and a unit.
func grpcTimeout(d time.Duration) string {
	if d <= 0 {
		d = time.Microsecond
	}
	for _, u := range []struct {
		unit string
		d    time.Duration
	}{{"u", time.Microsecond}, {"m", time.Millisecond}, {"S", time.Second}, {"M", time.Minute}} {
		if n := (d + u.d - 1) / u.d; n < 1e8 {
			return strconv.FormatInt(int64(n), 10) + u.unit
		}
	}
	return "99999999H"
}

// unary makes one call on the connection: method is the full path
// ("/pkg.Service/Method"), req the encoded request. It returns the encoded
// response or the call's *Error. A transport failure leaves the connection
// unusable; the caller closes it.
func (c *conn) unary(ctx context.Context, method string, req []byte) ([]byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.nc.SetDeadline(dl)
	} else {
		_ = c.nc.SetDeadline(time.Time{})
	}
	// A context cancelled in the middle of a read or write breaks it off.
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	resp, err := c.exchange(ctx, method, req)
	if !stop() {
		// The deadline was moved into the past: the connection is no
		// good for another call.
		c.goneAway = true
	}
	if err == nil {
		return resp, nil
	}
	var ne net.Error
	ctxErr := ctx.Err()
	if ctxErr != nil || (errors.As(err, &ne) && ne.Timeout()) {
		// The stream was cut short; its connection is out of step.
		c.goneAway = true
		if errors.Is(ctxErr, context.Canceled) {
			return nil, errorf(Canceled, "context canceled")
		}
		return nil, errorf(DeadlineExceeded, "context deadline exceeded")
	}
	return nil, err
}

func (c *conn) exchange(ctx context.Context, method string, req []byte) ([]byte, error) {
	id := c.nextStream
	c.nextStream += 2
	c.curStream, c.streamWin = id, c.streamInit
	defer func() { c.curStream = 0 }()

	c.hb.Reset()
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "nftredir-cni"},
	} {
		_ = c.enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.enc.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: grpcTimeout(time.Until(dl))})
	}
	if c.hb.Len() > defaultMaxFrame {
		return nil, errorf(Internal, "request headers too large")
	}
	msg := make([]byte, 5, 5+len(req))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(req)))
	msg = append(msg, req...)
	out := appendFrame(nil, frameHeaders, flagEndHeaders, id, c.hb.Bytes())

	// DATA as far as the windows allow; the rest after WINDOW_UPDATEs.
	for len(msg) > 0 {
		n := int(min(int64(len(msg)), int64(c.maxFrame), c.connSend, c.streamWin))
		if n <= 0 {
			if err := c.write(out); err != nil {
				return nil, err
			}
			out = out[:0]
			f, err := c.readFrame()
			if err != nil {
				return nil, err
			}
			if f.stream == id && (f.typ == frameHeaders || f.typ == frameRSTStream || f.typ == frameData) {
				// The server answered (an error, most likely) before
				// taking the whole request.
				return c.response(&f, id)
			}
			if err := c.control(f); err != nil {
				return nil, err
			}
			if c.goneAway && c.lastStream < id {
				return nil, errorf(Unavailable, "nftredird is shutting down (GOAWAY)")
			}
			continue
		}
		flags := byte(0)
		if n == len(msg) {
			flags = flagEndStream
		}
		out = appendFrame(out, frameData, flags, id, msg[:n])
		msg = msg[n:]
		c.connSend -= int64(n)
		c.streamWin -= int64(n)
	}
	if err := c.write(out); err != nil {
		return nil, err
	}
	return c.response(nil, id)
}

// response reads the call's response, starting with first when it has
// been read already.
func (c *conn) response(first *frame, id uint32) ([]byte, error) {
	var (
		body       []byte
		gotHeaders bool
		httpStatus string
	)
	for {
		var f frame
		if first != nil {
			f, first = *first, nil
		} else {
			var err error
			if f, err = c.readFrame(); err != nil {
				return nil, err
			}
		}
		if f.stream != id {
			if f.stream != 0 && (f.typ == frameHeaders || f.typ == frameContinuation) {
				// A header block of another stream must still go through
				// the decoder, to keep its table in step.
				if _, err := c.headerBlock(f); err != nil {
					return nil, err
				}
				continue
			}
			if err := c.control(f); err != nil {
				return nil, err
			}
			if c.goneAway && c.lastStream < id {
				return nil, errorf(Unavailable, "nftredird is shutting down (GOAWAY)")
			}
			continue
		}
		switch f.typ {
		case frameData:
			p, err := unpad(f)
			if err != nil {
				return nil, err
			}
			if len(body)+len(p) > MaxResponse+5 {
				return nil, errorf(ResourceExhausted, fmt.Sprintf("response larger than %d bytes", MaxResponse))
			}
			body = append(body, p...)
			if f.flags&flagEndStream != 0 {
				return nil, errorf(Internal, "server closed the stream without sending trailers")
			}
		case frameHeaders:
			fields, err := c.headerBlock(f)
			if err != nil {
				return nil, err
			}
			var grpcStatus, grpcMessage string
			hasStatus := false
			for _, h := range fields {
				switch h.Name {
				case ":status":
					httpStatus = h.Value
				case "grpc-status":
					grpcStatus, hasStatus = h.Value, true
				case "grpc-message":
					grpcMessage = h.Value
				}
			}
			if !gotHeaders && httpStatus != "200" {
				st, _ := strconv.Atoi(httpStatus)
				if !hasStatus {
					return nil, errorf(httpStatusCode(st), "unexpected HTTP status code received from server: "+httpStatus)
				}
			}
			gotHeaders = true
			if f.flags&flagEndStream == 0 {
				continue
			}
			if !hasStatus {
				return nil, errorf(Internal, "server closed the stream without a grpc-status")
			}
			code, err := strconv.ParseUint(grpcStatus, 10, 32)
			if err != nil {
				return nil, errorf(Internal, "malformed grpc-status: "+grpcStatus)
			}
			if code != 0 {
				return nil, errorf(Code(code), decodeMessage(grpcMessage))
			}
			return unframe(body)
		case frameRSTStream:
			if len(f.payload) != 4 {
				return nil, errorf(Internal, "http2: malformed RST_STREAM")
			}
			h2code := binary.BigEndian.Uint32(f.payload)
			return nil, errorf(resetCode(h2code), fmt.Sprintf("stream terminated by RST_STREAM with error code: %d", h2code))
		case frameWindowUpdate, framePriority:
			if err := c.control(f); err != nil {
				return nil, err
			}
		}
	}
}

// unframe takes the one message out of a unary response's body.
func unframe(body []byte) ([]byte, error) {
	if len(body) < 5 {
		return nil, errorf(Internal, "response without a message")
	}
	if body[0] != 0 {
		return nil, errorf(Internal, "compressed response; the client asked for none")
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if int64(n) != int64(len(body)-5) {
		return nil, errorf(Internal, "response is not one message")
	}
	return body[5:], nil
}
