package server

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func peerCtx(info credentials.AuthInfo) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.UnixAddr{Name: "@", Net: "unix"}, AuthInfo: info})
}

func ucred(uid, gid uint32) PeerInfo {
	return PeerInfo{Ucred: &unix.Ucred{Pid: 42, Uid: uid, Gid: gid}}
}

func TestAuthorize(t *testing.T) {
	allow := newAllowList([]uint32{1000}, []uint32{1337})
	tests := []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"root", peerCtx(ucred(0, 0)), codes.OK},
		{"allowed uid", peerCtx(ucred(1000, 5)), codes.OK},
		{"allowed gid", peerCtx(ucred(2000, 1337)), codes.OK},
		{"stranger", peerCtx(ucred(1234, 1234)), codes.PermissionDenied},
		{"unreadable credentials", peerCtx(PeerInfo{}), codes.Unauthenticated},
		{"other transport", peerCtx(credentials.TLSInfo{}), codes.Unauthenticated},
		{"no peer", context.Background(), codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := status.Code(allow.authorize(tt.ctx)); got != tt.want {
				t.Fatalf("code = %v, want %v", got, tt.want)
			}
		})
	}
	err := allow.authorize(peerCtx(ucred(1234, 1234)))
	if msg := status.Convert(err).Message(); msg != "caller uid 1234 gid 1234 is not allowed; start nftredird with --allow-uid/--allow-gid" {
		t.Errorf("message = %q", msg)
	}
}

func TestAuthInterceptorsRunBeforeHandlers(t *testing.T) {
	allow := newAllowList(nil, nil)
	called := false
	handler := func(context.Context, any) (any, error) { called = true; return "ok", nil }
	ctx := peerCtx(ucred(1234, 1234))
	_, err := allow.unaryInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/nftredir.v1.RedirectService/AddPod"}, handler)
	if status.Code(err) != codes.PermissionDenied || called {
		t.Fatalf("unary: err %v, handler called %v", err, called)
	}
	// Health is open to anyone who can reach the socket.
	if _, err := allow.unaryInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}, handler); err != nil || !called {
		t.Fatalf("health: err %v, handler called %v", err, called)
	}
	called = false
	stream := func(any, grpc.ServerStream) error { called = true; return nil }
	err = allow.streamInterceptor()(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: "/nftredir.v1.RedirectService/WatchPods"}, stream)
	if status.Code(err) != codes.PermissionDenied || called {
		t.Fatalf("stream: err %v, handler called %v", err, called)
	}
}

// fakeStream is a server stream that only has a context; the embedded
// nil interface panics if the code under test does anything else.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }

func TestPeerCredentialsHandshakeReadsUcred(t *testing.T) {
	a, b, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	_, info, err := PeerCredentials{}.ServerHandshake(a)
	if err != nil {
		t.Fatal(err)
	}
	pi, ok := info.(PeerInfo)
	if !ok || pi.Ucred == nil {
		t.Fatalf("no credentials in %#v", info)
	}
	if int(pi.Ucred.Uid) != unix.Geteuid() || int(pi.Ucred.Pid) != unix.Getpid() {
		t.Errorf("ucred %+v is not this process", *pi.Ucred)
	}
	// A connection that is not a socket yields no credentials, not a panic.
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	_, info, err = PeerCredentials{}.ServerHandshake(p1)
	if err != nil || info.(PeerInfo).Ucred != nil {
		t.Errorf("pipe: %v, %+v", err, info)
	}
	if !strings.Contains(PeerCredentials{}.Info().SecurityProtocol, "peercred") {
		t.Error("protocol name")
	}
}

func socketPair() (net.Conn, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conn := func(fd int) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		return net.FileConn(f)
	}
	a, err := conn(fds[0])
	if err != nil {
		return nil, nil, err
	}
	b, err := conn(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}
