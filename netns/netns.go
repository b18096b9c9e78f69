// Package netns opens caller-supplied network namespace paths safely and
// runs netlink work (policy routing) inside them.
//
// Netlink sockets belong to the namespace of the thread that creates
// them. A handle enters its namespace once, on a locked OS thread of its
// own that nothing else runs on (see onSacrificialThread), and makes
// there every socket later work on the handle uses (rtnetlink, and the
// nftables connections package nft asks for through Netfilter); then the
// thread goes back, or is destroyed if it cannot. That visit is Open's
// where Open must enter to read the namespace's cookie, else the
// handle's first use (see cookieByID). No other goroutine's thread ever
// changes namespace.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Errors callers can tell apart with errors.Is. The server maps them to
// gRPC codes; nothing else should need to know which check failed.
var (
	// ErrNotExist: nothing at the path (or a dangling symlink).
	ErrNotExist = errors.New("network namespace path does not exist")
	// ErrNotNetns: the path exists but is not a network namespace file.
	ErrNotNetns = errors.New("not a network namespace")
	// ErrHostNetns: the path names the node's own network namespace (or
	// another namespace this process is told to protect).
	ErrHostNetns = errors.New("refusing the node's own network namespace")
	// ErrNotAbsolute: relative paths depend on the daemon's working
	// directory, which a caller neither knows nor controls.
	ErrNotAbsolute = errors.New("network namespace path must be absolute")
	// ErrNoAccess: the path exists but this process may not open it (in
	// some sandboxes even root cannot open PID 1's namespace).
	ErrNoAccess = errors.New("network namespace path is not accessible")
	// ErrTimeout: opening the path did not finish in time, as on a hung
	// FUSE or NFS mount, or too many earlier opens are still stuck. Nothing
	// was opened; a later try may succeed.
	ErrTimeout = errors.New("network namespace path did not answer in time")
)

// Defaults of GuardConfig.
const (
	// DefaultOpenTimeout: a namespace file opens in microseconds; a path
	// that takes seconds is stuck.
	DefaultOpenTimeout = 2 * time.Second
	// DefaultMaxPendingOpens bounds the opens in the kernel at once. An
	// open stuck on a hung mount cannot be interrupted and holds a thread
	// until the mount answers or dies, so this is also how many threads
	// hostile paths can take.
	DefaultMaxPendingOpens = 16
)

// ID identifies a namespace: the device and inode of its nsfs file, and
// its cookie. The kernel reuses inode numbers as soon as a namespace is
// freed, so a path recreated after its namespace died may show the same
// dev:ino; the cookie (SO_NETNS_COOKIE) is never reused and tells them
// apart. A zero Cookie means unknown (kernels before 5.14, or IDs of
// protected namespaces, which are alive and need none).
type ID struct {
	Dev    uint64
	Ino    uint64
	Cookie uint64
}

// String renders "dev:ino:cookie", or "dev:ino" without a cookie; this is
// the form stored in state records.
func (id ID) String() string {
	if id.Cookie == 0 {
		return fmt.Sprintf("%d:%d", id.Dev, id.Ino)
	}
	return fmt.Sprintf("%d:%d:%d", id.Dev, id.Ino, id.Cookie)
}

// IsZero reports whether the ID is unset.
func (id ID) IsZero() bool { return id == ID{} }

// SameFile reports whether both IDs name the same nsfs inode, ignoring
// the cookie.
func (id ID) SameFile(o ID) bool { return id.Dev == o.Dev && id.Ino == o.Ino }

// ParseID reads the forms produced by String.
func ParseID(s string) (ID, error) {
	var id ID
	parts := strings.Split(s, ":")
	if len(parts) != 2 && len(parts) != 3 {
		return ID{}, fmt.Errorf("parse namespace id %q: want dev:ino or dev:ino:cookie", s)
	}
	dst := []*uint64{&id.Dev, &id.Ino, &id.Cookie}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return ID{}, fmt.Errorf("parse namespace id %q: %w", s, err)
		}
		*dst[i] = v
	}
	return id, nil
}

// Handle is an open, validated network namespace. Everything done to the
// namespace after Open goes through Fd, so a path swapped after the checks
// cannot redirect the work elsewhere.
type Handle struct {
	fd    int
	path  string
	id    ID
	fault func(path, step string) error

	mu sync.Mutex
	// protects the following field: the sockets made inside the
	// namespace, serialised because each carries one exchange at a time
	c conns
}

// Fd is the open namespace file descriptor, valid until Close. It is read
// without the handle's lock: a handle belongs to one call at a time, and
// Close must not race any other use of it.
func (h *Handle) Fd() int { return h.fd }

// Path is the path the handle was opened from, for logs and records.
func (h *Handle) Path() string { return h.path }

// ID is the namespace identity (dev:ino) read from the open fd.
func (h *Handle) ID() ID { return h.id }

// Close releases the fd and the sockets made inside the namespace. Safe
// to call twice.
func (h *Handle) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil
	}
	h.closeConns()
	err := unix.Close(h.fd)
	h.fd = -1
	return err
}

// Guard opens namespace paths and refuses the ones that must never be
// programmed: the namespace of this process, that of PID 1 (the node), and
// any extra namespaces named at construction (for example a configured
// node namespace).
type Guard struct {
	protected []ID
	warnings  []string
	timeout   time.Duration
	fault     func(path, step string) error
	// cookieByID: Open reads a namespace's cookie without entering it
	// (see cookieByID).
	cookieByID bool
	// slots holds a token per open in the kernel.
	slots chan struct{}

	mu sync.Mutex
	// protects the following field: the opens in the kernel by path,
	// closed when each finishes, so one stuck path takes one slot however
	// often it is retried
	pending map[string]chan struct{}
}

// GuardConfig configures NewGuardConfig. Zero values take the defaults.
type GuardConfig struct {
	// Protect names extra namespaces to refuse; each must exist and be a
	// network namespace.
	Protect []string
	// OpenTimeout bounds each Open.
	OpenTimeout time.Duration
	// MaxPendingOpens bounds the opens in the kernel at once.
	MaxPendingOpens int
	// Fault, when set, is asked before each change a handle of the guard
	// makes to a namespace's policy routing (the steps RoutingSteps
	// names), with the namespace's path; an error it returns fails that
	// change as a refusal by the kernel would. Tests fail each step of an
	// AddPod in turn with it; nil in the daemon.
	Fault func(path, step string) error
}

// NewGuard builds a Guard that protects this process's namespace, PID 1's
// and the namespaces at extraProtected (each must exist and be a network
// namespace), with the default bounds.
func NewGuard(extraProtected ...string) (*Guard, error) {
	return NewGuardConfig(GuardConfig{Protect: extraProtected})
}

// NewGuardConfig builds a Guard from cfg.
func NewGuardConfig(cfg GuardConfig) (*Guard, error) {
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = DefaultOpenTimeout
	}
	if cfg.MaxPendingOpens <= 0 {
		cfg.MaxPendingOpens = DefaultMaxPendingOpens
	}
	g := &Guard{timeout: cfg.OpenTimeout, fault: cfg.Fault, slots: make(chan struct{}, cfg.MaxPendingOpens), pending: map[string]chan struct{}{},
		cookieByID: cookieByID()}
	for _, p := range append([]string{"/proc/self/ns/net", "/proc/1/ns/net"}, cfg.Protect...) {
		id, err := statID(p)
		if err != nil {
			// PID 1's namespace is unreadable in some sandboxes (no
			// CAP_SYS_PTRACE over it); our own must always be readable.
			if p == "/proc/1/ns/net" && errors.Is(err, os.ErrPermission) {
				g.warnings = append(g.warnings, "cannot read /proc/1/ns/net; only this process's own namespace is known as the node's")
				continue
			}
			return nil, fmt.Errorf("protect namespace %s: %w", p, err)
		}
		g.protected = append(g.protected, id)
	}
	return g, nil
}

// Warnings says what the guard could not protect, for the daemon's log.
func (g *Guard) Warnings() []string { return append([]string(nil), g.warnings...) }

// Open opens path once and checks the opened file itself: it must live on
// nsfs, be a network namespace, and not be a protected namespace. Symlinks
// (including /proc/PID/ns/net) are followed; the checks apply to whatever
// was actually opened.
//
// The caller chose the path, which may lead onto a hung FUSE or NFS mount
// where open and stat block in the kernel, uninterruptibly. So the work
// runs on its own goroutine and Open returns ErrTimeout after the
// configured time; the stuck goroutine finishes (and closes what it
// opened) whenever the mount answers or dies. At most MaxPendingOpens are
// in the kernel at once, and a path with an open still in the kernel is
// not opened again until that one finishes, so retries of a hung path do
// not pile up threads.
func (g *Guard) Open(path string) (*Handle, error) {
	return g.openBounded(path, 0)
}

// openBounded is Open, with extra flags (O_NOFOLLOW) for the path's
// first open.
func (g *Guard) openBounded(path string, flags int) (*Handle, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%q: %w", path, ErrNotAbsolute)
	}
	timer := time.NewTimer(g.timeout)
	defer timer.Stop()
	var done chan struct{}
	for done == nil {
		g.mu.Lock()
		earlier, busy := g.pending[path]
		if !busy {
			done = make(chan struct{})
			g.pending[path] = done
		}
		g.mu.Unlock()
		if busy {
			select {
			case <-earlier:
			case <-timer.C:
				return nil, fmt.Errorf("%s: an earlier open is still stuck after %s (a hung network or FUSE mount?): %w", path, g.timeout, ErrTimeout)
			}
		}
	}
	finish := func() {
		g.mu.Lock()
		delete(g.pending, path)
		g.mu.Unlock()
		close(done)
	}
	select {
	case g.slots <- struct{}{}:
	case <-timer.C:
		finish()
		return nil, fmt.Errorf("%s: %d earlier opens are stuck (hung mounts?): %w", path, cap(g.slots), ErrTimeout)
	}
	type result struct {
		h   *Handle
		err error
	}
	// Unbuffered: the result is either taken by the caller or, once the
	// caller has given up, closed by the goroutine; never both, never
	// neither.
	res := make(chan result)
	abandoned := make(chan struct{})
	go func() {
		defer func() { <-g.slots }()
		defer finish()
		h, err := g.open(path, flags)
		select {
		case res <- result{h, err}:
		case <-abandoned:
			h.Close()
		}
	}()
	select {
	case r := <-res:
		return r.h, r.err
	case <-timer.C:
		close(abandoned)
		// The result may be ready just now.
		select {
		case r := <-res:
			return r.h, r.err
		default:
		}
		return nil, fmt.Errorf("%s did not answer within %s (a hung network or FUSE mount?): %w", path, g.timeout, ErrTimeout)
	}
}

// open does Open's work on the calling goroutine.
func (g *Guard) open(path string, flags int) (*Handle, error) {
	// O_PATH first: opening a device for reading can have side effects
	// (a watchdog starts counting, a tape rewinds), and the caller chose
	// the path. Only a file on nsfs is then opened for real, through the
	// O_PATH fd, so it is the same file.
	pathFd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		return nil, openError(path, err)
	}
	defer unix.Close(pathFd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(pathFd, &fs); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", path, err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("%s is not a namespace file: %w", path, ErrNotNetns)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pathFd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, openError(path, err)
	}
	h := &Handle{fd: fd, path: path, fault: g.fault}
	if err := g.check(h); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

func openError(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s: %w", path, ErrNotExist)
	case errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ELOOP):
		// ENXIO: a Unix socket; ELOOP: a symlink cycle. Neither can be a
		// namespace.
		return fmt.Errorf("%s: %w", path, ErrNotNetns)
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		return fmt.Errorf("%s: %w", path, ErrNoAccess)
	}
	return fmt.Errorf("open %s: %w", path, err)
}

// check runs on the fd Open reopened from its O_PATH fd, which Open has
// already found on nsfs.
func (g *Guard) check(h *Handle) error {
	nstype, err := unix.IoctlRetInt(h.fd, unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("query namespace type of %s: %w", h.path, err)
	}
	if nstype != unix.CLONE_NEWNET {
		return fmt.Errorf("%s is a namespace of another kind: %w", h.path, ErrNotNetns)
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", h.path, err)
	}
	h.id = ID{Dev: st.Dev, Ino: st.Ino}
	for _, p := range g.protected {
		if p.SameFile(h.id) {
			return fmt.Errorf("%s (%s): %w", h.path, h.id, ErrHostNetns)
		}
	}
	if g.cookieByID {
		// One ioctl on the file: nothing enters the namespace until the
		// handle is used.
		c, err := unix.IoctlGetUint64(h.fd, unix.NS_GET_ID)
		if err != nil {
			return fmt.Errorf("read cookie of %s: %w", h.path, err)
		}
		h.id.Cookie = c
		return nil
	}
	// The visit that reads the cookie makes the handle's connections
	// too, so that an AddPod enters the namespace once either way.
	return h.visit(&h.id.Cookie)
}

// cookieByID says whether this kernel's NS_GET_ID of a network namespace
// (Linux 6.18) is the namespace's cookie, SO_NETNS_COOKIE: then Open
// reads the cookie with an ioctl on the namespace file instead of
// entering the namespace to make a socket there. The kernel is the same
// for the process's life, so it is found out once. It is checked, not
// assumed from the version, on the process's own namespace and on one
// made for the check: were the two counters apart on some kernel, IDs
// read one way would not match the records an earlier daemon wrote the
// other way, and every pod would look moved.
var cookieByID = sync.OnceValue(func() bool {
	same := func() (bool, error) {
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, err
		}
		defer unix.Close(fd)
		id, err := unix.IoctlGetUint64(fd, unix.NS_GET_ID)
		if err != nil {
			return false, err // before Linux 6.18: ENOTTY
		}
		c, err := cookieHere()
		return err == nil && c != 0 && c == id, err
	}
	ok := false
	err := onSacrificialThread(func() error {
		home, err := vnetns.Get()
		if err != nil {
			return err
		}
		defer home.Close()
		if ok, err = same(); !ok {
			return err
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ok = false
			return err
		}
		ok, err = same()
		if serr := vnetns.Set(home); serr != nil {
			ok = false
			return serr
		}
		return err
	})
	return ok && err == nil
})

// StatID returns the identity of the namespace at path without keeping it
// open, following symlinks. It does not validate the file's kind.
func statID(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return ID{}, fmt.Errorf("stat %s: %w", path, os.ErrPermission)
		}
		return ID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}
