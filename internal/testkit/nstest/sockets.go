package nstest

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds every dial and exchange unless a Dial says
// otherwise. Everything travels over a veth or loopback, so a connection
// that has not completed by then is not going to.
const DefaultTimeout = 2 * time.Second

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/
// ip6_tables.h; x/sys/unix only defines the IPv4 name.
const ip6tSOOriginalDst = 80

// Record is what a listener saw of one connection or datagram.
type Record struct {
	// Listener is the name the listener was started with.
	Listener string
	// Token is the random string the client sent, which ties the record to
	// one Exchange.
	Token string
	// Local and Remote are the accepted socket's addresses (IPv4 in IPv4
	// form even when accepted on a dual-stack socket). For a datagram,
	// Local is the address the listener is bound to.
	Local, Remote netip.AddrPort
	// OrigDst is SO_ORIGINAL_DST: the destination before NAT. It is not
	// valid when the kernel had no conntrack entry for the connection.
	OrigDst netip.AddrPort
}

func (r Record) String() string {
	s := fmt.Sprintf("%s local=%s remote=%s", r.Listener, r.Local, r.Remote)
	if r.OrigDst.IsValid() {
		s += " origdst=" + r.OrigDst.String()
	}
	return s
}

// Recorder collects the records of every listener of a test, keyed by
// token, so the test can ask who answered a given exchange.
type Recorder struct {
	mu   sync.Mutex
	recs map[string]Record
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{recs: map[string]Record{}} }

func (r *Recorder) put(rec Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs[rec.Token] = rec
}

// Lookup returns the record for token.
func (r *Recorder) Lookup(token string) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.recs[token]
	return rec, ok
}

// Sockopts are the options a socket gets before it binds.
type Sockopts struct {
	// Mark is SO_MARK; zero leaves the socket unmarked.
	Mark uint32
	// Transparent sets IP_TRANSPARENT (IPV6_TRANSPARENT on IPv6 sockets):
	// a listener then accepts tproxied connections, and a dialer may bind
	// to an address the namespace does not own.
	Transparent bool
}

func (o Sockopts) control(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if o.Mark != 0 {
			if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(o.Mark)); err != nil {
				serr = fmt.Errorf("SO_MARK %#x: %w", o.Mark, err)
				return
			}
		}
		if o.Transparent {
			// Both options set the same socket flag; a dual-stack socket is
			// an IPv6 socket, so network ends in 6 for it too.
			level, opt, name := unix.SOL_IP, unix.IP_TRANSPARENT, "IP_TRANSPARENT"
			if strings.HasSuffix(network, "6") {
				level, opt, name = unix.SOL_IPV6, unix.IPV6_TRANSPARENT, "IPV6_TRANSPARENT"
			}
			if err := unix.SetsockoptInt(int(fd), level, opt, 1); err != nil {
				serr = fmt.Errorf("%s: %w", name, err)
			}
		}
	})
	return errors.Join(err, serr)
}

// Listen is one listener to start inside a namespace.
type Listen struct {
	// Name identifies the listener in records and in its replies.
	Name string
	// Network is tcp, tcp4, tcp6, udp4 or udp6. tcp with an IPv6
	// unspecified address is a dual-stack listener, as ztunnel uses.
	Network string
	Addr    netip.AddrPort
	Sockopts
}

// Listen starts l inside the namespace. Each client sends a token line;
// the listener records the connection under that token and answers with
// its name. The listener stops when the test ends.
func (n *Netns) Listen(t testing.TB, rec *Recorder, l Listen) {
	t.Helper()
	lc := net.ListenConfig{Control: l.control}
	var (
		tl net.Listener
		pc net.PacketConn
	)
	err := n.Do(func() error {
		var err error
		if strings.HasPrefix(l.Network, "udp") {
			pc, err = lc.ListenPacket(t.Context(), l.Network, l.Addr.String())
		} else {
			tl, err = lc.Listen(t.Context(), l.Network, l.Addr.String())
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen %s on %s %s in %s: %v", l.Name, l.Network, l.Addr, n.Name, err)
	}
	var wg sync.WaitGroup
	if pc != nil {
		wg.Go(func() { serveUDP(pc.(*net.UDPConn), rec, l.Name, l.Addr) })
		t.Cleanup(func() { pc.Close(); wg.Wait() })
		return
	}
	wg.Go(func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { serveTCP(c.(*net.TCPConn), rec, l.Name) })
		}
	})
	t.Cleanup(func() { tl.Close(); wg.Wait() })
}

func serveTCP(c *net.TCPConn, rec *Recorder, name string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(DefaultTimeout))
	token, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	r := Record{
		Listener: name,
		Token:    strings.TrimSuffix(token, "\n"),
		Local:    unmap(local),
		Remote:   unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()),
	}
	if sc, err := c.SyscallConn(); err == nil {
		if od, err := originalDst(sc, local.Addr().Unmap().Is4()); err == nil {
			r.OrigDst = od
		}
	}
	rec.put(r)
	c.Write([]byte(name + "\n"))
}

func serveUDP(c *net.UDPConn, rec *Recorder, name string, bound netip.AddrPort) {
	buf := make([]byte, 512)
	for {
		m, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		rec.put(Record{Listener: name, Token: string(buf[:m]), Local: bound, Remote: unmap(from)})
		c.WriteToUDPAddrPort([]byte(name), from)
	}
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// originalDst reads SO_ORIGINAL_DST. On a dual-stack socket an IPv4
// connection is asked at the IPv4 level, as ztunnel does.
func originalDst(sc syscall.RawConn, v4 bool) (netip.AddrPort, error) {
	var (
		res  netip.AddrPort
		serr error
	)
	err := sc.Control(func(fd uintptr) {
		if v4 {
			var sa unix.RawSockaddrInet4
			if serr = getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa)); serr == nil {
				res = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
			}
			return
		}
		var sa unix.RawSockaddrInet6
		if serr = getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), unsafe.Sizeof(sa)); serr == nil {
			res = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), ntohs(sa.Port))
		}
	})
	return res, errors.Join(err, serr)
}

func getsockopt(fd uintptr, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// ntohs reads a port stored in network byte order in a raw sockaddr.
func ntohs(port uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&port))
	return uint16(b[0])<<8 | uint16(b[1])
}

// Dial is one client connection made from inside a namespace.
type Dial struct {
	// Network is tcp4, tcp6, udp4 or udp6.
	Network string
	To      netip.AddrPort
	// From binds the socket first; with Transparent it may be an address
	// the namespace does not own (a spoofed source).
	From netip.AddrPort
	Sockopts
	// Timeout bounds the whole exchange; zero means DefaultTimeout.
	Timeout time.Duration
}

// Exchange dials d from inside the namespace, sends a fresh token and
// returns the record of the listener that answered. It fails when the
// connection cannot be made or nobody answers within the timeout.
func (n *Netns) Exchange(rec *Recorder, d Dial) (Record, error) {
	timeout := d.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	dl := net.Dialer{Timeout: timeout, Control: d.control}
	if d.From.IsValid() {
		if strings.HasPrefix(d.Network, "udp") {
			dl.LocalAddr = net.UDPAddrFromAddrPort(d.From)
		} else {
			dl.LocalAddr = net.TCPAddrFromAddrPort(d.From)
		}
	}
	var c net.Conn
	if err := n.Do(func() error {
		var err error
		c, err = dl.Dial(d.Network, d.To.String())
		return err
	}); err != nil {
		return Record{}, fmt.Errorf("dial %s %s from %s: %w", d.Network, d.To, n.Name, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	token := newToken()
	var who string
	if strings.HasPrefix(d.Network, "udp") {
		// A datagram may be lost, and DNS clients resend: so does this,
		// a few times within the timeout, with the same token (a listener
		// answers each copy alike).
		const tries = 4
		buf := make([]byte, 512)
		var m int
		var err error
		for i := range tries {
			if _, err = c.Write([]byte(token)); err != nil {
				return Record{}, fmt.Errorf("send to %s: %w", d.To, err)
			}
			if i < tries-1 {
				c.SetReadDeadline(time.Now().Add(timeout / tries))
			} else {
				c.SetReadDeadline(time.Now().Add(timeout))
			}
			if m, err = c.Read(buf); err == nil {
				break
			}
		}
		if err != nil {
			return Record{}, fmt.Errorf("no reply from %s after %d datagrams: %w", d.To, tries, err)
		}
		who = string(buf[:m])
	} else {
		if _, err := c.Write([]byte(token + "\n")); err != nil {
			return Record{}, fmt.Errorf("send to %s: %w", d.To, err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return Record{}, fmt.Errorf("no reply from %s: %w", d.To, err)
		}
		who = strings.TrimSuffix(line, "\n")
	}
	r, ok := rec.Lookup(token)
	if !ok || r.Listener != who {
		return Record{}, fmt.Errorf("reply from %q to %s has no matching record (%v)", who, d.To, r)
	}
	return r, nil
}

func newToken() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
