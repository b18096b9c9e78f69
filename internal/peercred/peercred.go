// Package peercred says who is on the other end of a Unix socket, as the
// kernel recorded it when the caller connected, and whether that caller
// may use the daemon. The gRPC API and the ZDS socket both check their
// callers with it, each against its own Allowlist.
package peercred

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cred is the caller's identity at connect(2). The kernel snapshots it
// then, so a caller cannot change it afterwards by changing its own
// credentials or by exiting and having its pid reused.
type Cred struct {
	PID int32
	UID uint32
	// GID is the effective gid.
	GID uint32
	// Groups are the supplementary groups (SO_PEERGROUPS, Linux 4.13+);
	// nil when the kernel cannot say, and then only GID counts.
	Groups []uint32
}

// FromFd reads the credentials of the peer of the connected socket fd.
func FromFd(fd int) (*Cred, error) {
	u, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return nil, fmt.Errorf("read SO_PEERCRED: %w", err)
	}
	c := &Cred{PID: u.Pid, UID: u.Uid, GID: u.Gid}
	groups, err := peerGroups(fd)
	if err != nil && !errors.Is(err, unix.ENOPROTOOPT) {
		return nil, fmt.Errorf("read SO_PEERGROUPS: %w", err)
	}
	c.Groups = groups
	return c, nil
}

// FromConn reads the peer's credentials of a connection that exposes its
// fd (*net.UnixConn does).
func FromConn(sc syscall.Conn) (*Cred, error) {
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var (
		c    *Cred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) { c, cerr = FromFd(int(fd)) }); err != nil {
		return nil, err
	}
	return c, cerr
}

// peerGroups reads SO_PEERGROUPS, growing the buffer when the kernel says
// it is too small (ERANGE, with the size it needs).
func peerGroups(fd int) ([]uint32, error) {
	n := 32
	for range 4 {
		buf := make([]uint32, n)
		size := uint32(4 * n)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch errno {
		case 0:
			return buf[:size/4], nil
		case unix.ERANGE:
			n = int(size/4) + 1
			continue
		default:
			return nil, errno
		}
	}
	return nil, unix.ERANGE
}

// Allowlist says which callers besides root may use a socket. The zero
// value allows root only.
type Allowlist struct {
	UIDs []uint32
	// GIDs are matched against the caller's effective gid and its
	// supplementary groups.
	GIDs []uint32
}

// NewAllowlist copies uids and gids.
func NewAllowlist(uids, gids []uint32) Allowlist {
	return Allowlist{UIDs: slices.Clone(uids), GIDs: slices.Clone(gids)}
}

// Allows reports whether c may use the socket: root (uid 0) always, then
// an allowed uid, an allowed primary gid, or an allowed supplementary
// group. A nil c (credentials unreadable) is refused.
func (a Allowlist) Allows(c *Cred) bool {
	if c == nil {
		return false
	}
	if c.UID == 0 || slices.Contains(a.UIDs, c.UID) || slices.Contains(a.GIDs, c.GID) {
		return true
	}
	for _, g := range c.Groups {
		if slices.Contains(a.GIDs, g) {
			return true
		}
	}
	return false
}

// String describes c for logs and errors.
func (c *Cred) String() string {
	if c == nil {
		return "unknown caller"
	}
	return fmt.Sprintf("uid %d gid %d groups %v pid %d", c.UID, c.GID, c.Groups, c.PID)
}
