package rpc

import (
	"encoding/binary"
	"errors"
)

// The protobuf wire format (protobuf.dev/programming-guides/encoding), as
// much of it as the messages in messages.go need. It is written out here
// rather than imported from google.golang.org/protobuf/encoding/protowire
// because that package's dependencies read the executable at start-up
// (internal/detrand), which every exec of the plugin would pay for.

type wireType uint8

const (
	varintType  wireType = 0
	fixed64Type wireType = 1
	bytesType   wireType = 2
	fixed32Type wireType = 5
)

var errMalformed = errors.New("malformed protobuf")

func appendVarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func appendTag(b []byte, num int, t wireType) []byte {
	return appendVarint(b, uint64(num)<<3|uint64(t))
}

func appendBytes(b []byte, num int, p []byte) []byte {
	b = appendTag(b, num, bytesType)
	b = appendVarint(b, uint64(len(p)))
	return append(b, p...)
}

func appendStringField(b []byte, num int, s string) []byte {
	b = appendTag(b, num, bytesType)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendVarintField(b []byte, num int, v uint64) []byte {
	return appendVarint(appendTag(b, num, varintType), v)
}

// consumeVarint reads a varint of at most ten bytes.
func consumeVarint(b []byte) (uint64, int, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, 0, errMalformed
	}
	return v, n, nil
}

// fields calls f for each field of a message: with its value for varint
// fields, its contents for length-delimited ones. Fixed-size fields are
// skipped; groups (deprecated, unused by nftredir.v1) are an error.
func fields(b []byte, f func(num int, t wireType, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		tag, n, err := consumeVarint(b)
		if err != nil {
			return err
		}
		b = b[n:]
		num, t := tag>>3, wireType(tag&7)
		if num == 0 || num > 1<<29-1 {
			return errMalformed
		}
		var (
			v  uint64
			bs []byte
		)
		switch t {
		case varintType:
			if v, n, err = consumeVarint(b); err != nil {
				return err
			}
			b = b[n:]
		case bytesType:
			l, n, err := consumeVarint(b)
			if err != nil || l > uint64(len(b)-n) {
				return errMalformed
			}
			bs, b = b[n:n+int(l)], b[n+int(l):]
		case fixed64Type:
			if len(b) < 8 {
				return errMalformed
			}
			b = b[8:]
			continue
		case fixed32Type:
			if len(b) < 4 {
				return errMalformed
			}
			b = b[4:]
			continue
		default:
			return errMalformed
		}
		if err := f(int(num), t, v, bs); err != nil {
			return err
		}
	}
	return nil
}
