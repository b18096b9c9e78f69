package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/nftredir/nftredir/internal/peercred"
)

// PeerCredentials is the server-side transport credential for a Unix
// socket: its handshake exchanges no bytes (plain-text clients work
// unchanged) and records the connecting process's uid, gid and pid as the
// kernel saw them at connect(2), for the auth interceptors.
type PeerCredentials struct{}

var _ credentials.TransportCredentials = PeerCredentials{}

// PeerInfo is the AuthInfo of a connection accepted with PeerCredentials.
type PeerInfo struct {
	credentials.CommonAuthInfo
	// Ucred is nil when the credentials could not be read (not a Unix
	// socket); such callers are refused as unauthenticated.
	Ucred *unix.Ucred
	// Groups are the caller's supplementary groups at connect(2), nil
	// when the kernel cannot say.
	Groups []uint32
}

// cred is the identity the allowlist checks, nil when unknown.
func (i PeerInfo) cred() *peercred.Cred {
	if i.Ucred == nil {
		return nil
	}
	return &peercred.Cred{PID: i.Ucred.Pid, UID: i.Ucred.Uid, GID: i.Ucred.Gid, Groups: i.Groups}
}

// AuthType names the scheme in logs and in grpc's peer info.
func (PeerInfo) AuthType() string { return "peercred" }

// ServerHandshake reads SO_PEERCRED from the accepted socket. Failing to
// read it does not fail the handshake, so the caller gets a clear
// Unauthenticated status instead of a dropped connection.
func (PeerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := PeerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			var cred *peercred.Cred
			var credErr error
			if err := raw.Control(func(fd uintptr) {
				cred, credErr = peercred.FromFd(int(fd))
			}); err == nil && credErr == nil {
				info.Ucred = &unix.Ucred{Pid: cred.PID, Uid: cred.UID, Gid: cred.GID}
				info.Groups = cred.Groups
			}
		}
	}
	return conn, info, nil
}

// ClientHandshake is not supported: these credentials are server-only.
func (PeerCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("peer credentials are server-side only; clients dial with insecure credentials")
}

// Info describes the protocol.
func (PeerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

// Clone returns the (stateless) credentials.
func (c PeerCredentials) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is meaningless without TLS.
//
// Deprecated: required by the interface only.
func (PeerCredentials) OverrideServerName(string) error { return nil }

// allowList says which callers besides root may use the API; the ZDS
// socket checks its callers with the same rules (peercred).
type allowList struct {
	peercred.Allowlist
}

func newAllowList(uids, gids []uint32) allowList {
	return allowList{peercred.NewAllowlist(uids, gids)}
}

// authorize checks the caller's credentials as the kernel recorded them at
// connect(2): uid, primary gid and supplementary groups (SO_PEERGROUPS),
// none of which the caller can change or race afterwards.
func (a allowList) authorize(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return errNoPeer
	}
	info, ok := p.AuthInfo.(PeerInfo)
	if !ok || info.Ucred == nil {
		return errNoCredentials
	}
	if a.Allows(info.cred()) {
		return nil
	}
	c := info.Ucred
	return callerNotAllowed(c.Uid, c.Gid)
}

// exemptFromAuth lists methods anyone who can reach the socket may call:
// health, so that readiness probes need no allowlist entry.
func exemptFromAuth(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/")
}

func (a allowList) unaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !exemptFromAuth(info.FullMethod) {
			if err := a.authorize(ctx); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

func (a allowList) streamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !exemptFromAuth(info.FullMethod) {
			if err := a.authorize(ss.Context()); err != nil {
				return err
			}
		}
		return handler(srv, ss)
	}
}

// peerFields adds the caller's identity to every request log line.
func peerFields(ctx context.Context) []any {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	if info, ok := p.AuthInfo.(PeerInfo); ok && info.Ucred != nil {
		return []any{"peer.uid", info.Ucred.Uid, "peer.gid", info.Ucred.Gid, "peer.pid", info.Ucred.Pid}
	}
	return []any{"peer", fmt.Sprint(p.Addr)}
}
