// Package standin has the pieces of a capture proxy that demos and
// benchmarks need: transparent listeners inside a namespace and recovery of
// a captured connection's original destination. It is not a proxy: it
// answers every connection with one line saying where it came from and
// where it was going.
package standin

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// soOriginalDst is SO_ORIGINAL_DST (IPv4) and IP6T_SO_ORIGINAL_DST (IPv6):
// both are option 80, at SOL_IP and SOL_IPV6 respectively.
const soOriginalDst = 80

// ListenConfig returns a ListenConfig whose sockets are transparent (so
// tproxy can deliver connections for addresses the namespace does not
// own) and carry mark, the proxy mark that keeps them out of capture.
func ListenConfig(mark uint32) net.ListenConfig {
	return net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		return control(c, network, mark, true)
	}}
}

// Dialer returns a dialer whose sockets carry mark (0 for none).
func Dialer(mark uint32) *net.Dialer {
	return &net.Dialer{Control: func(network, address string, c syscall.RawConn) error {
		return control(c, network, mark, false)
	}}
}

func control(c syscall.RawConn, network string, mark uint32, transparent bool) error {
	var opErr error
	err := c.Control(func(fd uintptr) {
		if mark != 0 {
			if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
				opErr = fmt.Errorf("set SO_MARK: %w", err)
				return
			}
		}
		if !transparent {
			return
		}
		level, opt := unix.SOL_IP, unix.IP_TRANSPARENT
		if network == "tcp6" || network == "udp6" {
			level, opt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT
		}
		if err := unix.SetsockoptInt(int(fd), level, opt, 1); err != nil {
			opErr = fmt.Errorf("set transparent: %w", err)
		}
	})
	if err != nil {
		return err
	}
	return opErr
}

// OriginalDst returns where a captured TCP connection was going. For a
// NATed (REDIRECT) connection that is SO_ORIGINAL_DST; for a tproxied one
// conntrack has no NAT record and the socket's local address already is
// the original destination.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, bool, error) {
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	raw, err := c.SyscallConn()
	if err != nil {
		return local, false, err
	}
	var dst netip.AddrPort
	var sockErr error
	err = raw.Control(func(fd uintptr) {
		if local.Addr().Unmap().Is4() {
			var sa unix.RawSockaddrInet4
			size := uint32(unsafe.Sizeof(sa))
			sockErr = getsockopt(int(fd), unix.SOL_IP, soOriginalDst, unsafe.Pointer(&sa), &size)
			if sockErr == nil {
				port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
				dst = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
			}
			return
		}
		var sa unix.RawSockaddrInet6
		size := uint32(unsafe.Sizeof(sa))
		sockErr = getsockopt(int(fd), unix.SOL_IPV6, soOriginalDst, unsafe.Pointer(&sa), &size)
		if sockErr == nil {
			port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
			dst = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
		}
	})
	if err != nil {
		return local, false, err
	}
	if sockErr != nil {
		// ENOENT: no NAT entry, so not a redirected connection.
		if errors.Is(sockErr, unix.ENOENT) {
			return local, false, nil
		}
		return local, false, sockErr
	}
	return dst, true, nil
}

func getsockopt(fd, level, opt int, val unsafe.Pointer, size *uint32) error {
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// ListenBoth listens on port for IPv4 and, when available, IPv6, as two
// sockets: an IPv4 socket is needed for SO_ORIGINAL_DST of IPv4 traffic.
func ListenBoth(ctx context.Context, lc net.ListenConfig, port uint16) ([]net.Listener, error) {
	l4, err := lc.Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, err
	}
	ls := []net.Listener{l4}
	if l6, err := lc.Listen(ctx, "tcp6", fmt.Sprintf("[::]:%d", port)); err == nil {
		ls = append(ls, l6)
	}
	return ls, nil
}
