package netns

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// errClosed: the handle's fd is gone. Work on it must fail rather than
// run wherever a library takes fd -1 to point (vishvananda/netlink: the
// calling thread's own namespace).
var errClosed = fmt.Errorf("network namespace handle is closed: %w", unix.EBADF)

// conns are the netlink connections a handle's work goes through, each
// a socket made inside the namespace. A socket keeps the namespace it
// was made in for its lifetime, wherever it is used from, so they are
// made in one visit and every later call is plain socket I/O. The visit
// is Open's where Open must enter the namespace to read its cookie, and
// else the handle's first use: a handle that is only opened (a pod the
// policy leaves alone: its namespace identified, nothing more) then
// never enters the namespace (Guard.Open).
type conns struct {
	// visited: the handle has entered the namespace and made them.
	visited bool
	// route is rtnetlink, for policy routing.
	route *netlink.Handle
	// tables is a lasting google/nftables connection, for batches.
	tables *nftables.Conn
	// reader reads our table back raw (see nftlive).
	reader *nftlive.Conn
	// err says why the last visit could not make one of them.
	err error
	// legacy are the legacy iptables tables with rules the last visit
	// found (see LegacyTables), legacyErr why it could not look.
	legacy    []XTable
	legacyErr error
}

// enter runs fn on a sacrificial thread inside the namespace, and brings
// the thread home after; a thread that cannot go home stays locked and
// dies with its goroutine (onSacrificialThread).
func (h *Handle) enter(fn func() error) error {
	return onSacrificialThread(func() error {
		home, err := vnetns.Get()
		if err != nil {
			return fmt.Errorf("current namespace: %w", err)
		}
		defer home.Close()
		if err := unix.Setns(h.fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter %s: %w", h.path, err)
		}
		err = fn()
		if rerr := vnetns.Set(home); rerr != nil && err == nil {
			err = fmt.Errorf("leave %s: %w", h.path, rerr)
		}
		return err
	})
}

// visit enters the namespace once and makes there whatever connection is
// missing, and looks at its legacy iptables tables; with cookie set it
// also reads the namespace's cookie. A connection that cannot be made is
// left nil: Open must not fail for a namespace nobody will program, and
// the work that needs it reports the error (see Handle.connect). Callers
// hold h.mu, or have the handle to themselves (Open).
func (h *Handle) visit(cookie *uint64) error {
	if h.fd < 0 {
		return errClosed
	}
	return h.enter(func() error { return h.makeHere(cookie) })
}

// makeHere runs on the visiting thread, inside the namespace: every
// constructor is asked for the calling thread's namespace, so none of
// them switches namespace again.
func (h *Handle) makeHere(cookie *uint64) error {
	if cookie != nil {
		c, err := cookieHere()
		if err != nil {
			return fmt.Errorf("read cookie of %s: %w", h.path, err)
		}
		*cookie = c
	}
	h.c.visited = true
	h.c.legacy, h.c.legacyErr = legacyHere()
	var errs []error
	if h.c.route == nil {
		// Only NETLINK_ROUTE: NewHandle otherwise opens XFRM and
		// NETFILTER sockets too.
		nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			errs = append(errs, fmt.Errorf("rtnetlink: %w", err))
		}
		h.c.route = nh
	}
	if h.c.tables == nil {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: %w", err))
		} else {
			// Were the lasting socket ever closed, the library would dial
			// anew in the caller's namespace unless told this one's.
			c.NetNS = h.fd
			h.c.tables = c
		}
	}
	if h.c.reader == nil {
		r, err := nftlive.Dial(0)
		if err != nil {
			errs = append(errs, err)
		}
		h.c.reader = r
	}
	h.c.err = errors.Join(errs...)
	return nil
}

// connect makes the missing connections in one more visit. Callers hold
// h.mu.
func (h *Handle) connect() error {
	if h.fd < 0 {
		return errClosed
	}
	if h.c.route != nil && h.c.tables != nil && h.c.reader != nil {
		return nil
	}
	return h.visit(nil)
}

// withRoute runs fn with the handle's rtnetlink connection, one caller
// at a time.
func (h *Handle) withRoute(fn func(nh *netlink.Handle) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.connect(); err != nil {
		return err
	}
	if h.c.route == nil {
		return fmt.Errorf("netlink in %s: %w", h.path, h.c.err)
	}
	return fn(h.c.route)
}

// Netfilter runs fn with the handle's nftables connections, one caller
// at a time: c (lasting) for batches, r for reading our table back.
// Both are sockets inside the namespace, made in the handle's visit. When
// fn fails, both are dropped and the next call makes new ones: a batch
// that failed may have left replies unread on the socket, which the next
// exchange would take for its own.
func (h *Handle) Netfilter(fn func(c *nftables.Conn, r *nftlive.Conn) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.connect(); err != nil {
		return err
	}
	if h.c.tables == nil || h.c.reader == nil {
		return fmt.Errorf("netlink in %s: %w", h.path, h.c.err)
	}
	err := fn(h.c.tables, h.c.reader)
	if err != nil {
		h.dropNetfilter()
	}
	return err
}

// dropNetfilter closes the nftables connections. Closing a netfilter
// socket after a batch that deleted anything waits for an RCU grace
// period in the kernel (5-25 ms here); the batch has committed by then,
// so nobody waits for it. Callers hold h.mu.
func (h *Handle) dropNetfilter() {
	if t := h.c.tables; t != nil {
		go t.CloseLasting()
	}
	if r := h.c.reader; r != nil {
		r.Close()
	}
	h.c.tables, h.c.reader = nil, nil
}

// closeConns closes every connection. Callers hold h.mu.
func (h *Handle) closeConns() {
	h.dropNetfilter()
	if h.c.route != nil {
		h.c.route.Close()
		h.c.route = nil
	}
}

// soNetnsCookie is SO_NETNS_COOKIE (Linux 5.14), absent from x/sys.
const soNetnsCookie = 71

// cookieHere reads the cookie of the calling thread's namespace from a
// socket made in it. Kernels without SO_NETNS_COOKIE give 0: identity
// then rests on dev:ino alone.
func cookieHere() (uint64, error) {
	s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, err
	}
	defer unix.Close(s)
	v, err := unix.GetsockoptUint64(s, unix.SOL_SOCKET, soNetnsCookie)
	if errors.Is(err, unix.ENOPROTOOPT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return v, nil
}
