package rpc

import (
	"errors"
	"strconv"
	"strings"
)

// Code is a gRPC status code. The numbers are gRPC's wire values, so they
// are the same as google.golang.org/grpc/codes (a test holds them to it).
type Code uint32

// The gRPC codes.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
	"Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
	"Unauthenticated",
}

// String is the code's name as grpc-go spells it.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// Error is a call's failure: a gRPC status the daemon sent, or one this
// client gave a failure of its own (Unavailable for a daemon it could not
// reach, DeadlineExceeded for a call that ran out of time), as grpc-go's
// client does.
type Error struct {
	Code    Code
	Message string
	// cause is the transport's error behind a status of this client's.
	cause error
}

// Unwrap is the transport's error behind the status, if any.
func (e *Error) Unwrap() error { return e.cause }

func (e *Error) Error() string {
	return "rpc error: code = " + e.Code.String() + " desc = " + e.Message
}

func errorf(c Code, msg string) *Error { return &Error{Code: c, Message: msg} }

// CodeOf is err's code: OK for nil, Unknown for an error that is not an
// *Error.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Unknown
}

// MessageOf is err's status message, or its text when it is not an *Error.
func MessageOf(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

// decodeMessage undoes the percent-encoding of grpc-message (gRPC's
// PROTOCOL-HTTP2: every byte outside 0x20-0x7e, and '%', is sent as %XX).
// A malformed escape is kept as it is, as grpc-go does.
func decodeMessage(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// httpStatusCode is what grpc-go's client makes of a response that is not
// gRPC (no grpc-status), by its HTTP status.
func httpStatusCode(status int) Code {
	switch status {
	case 400:
		return Internal
	case 401:
		return Unauthenticated
	case 403:
		return PermissionDenied
	case 404:
		return Unimplemented
	case 429, 502, 503, 504:
		return Unavailable
	}
	return Unknown
}

// resetCode is the code of a stream the server reset, by HTTP/2 error
// code, as grpc-go's client maps it.
func resetCode(h2code uint32) Code {
	switch h2code {
	case 0x3: // FLOW_CONTROL_ERROR
		return ResourceExhausted
	case 0x7: // REFUSED_STREAM: not processed, safe to retry
		return Unavailable
	case 0x8: // CANCEL
		return Canceled
	case 0xb: // ENHANCE_YOUR_CALM
		return ResourceExhausted
	case 0xc: // INADEQUATE_SECURITY
		return PermissionDenied
	}
	return Internal
}
