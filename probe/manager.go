package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/nft"
)

// SelfNetns is the daemon's own network namespace, the node's by default.
const SelfNetns = "/proc/self/ns/net"

// Config configures a Manager. Zero values take the defaults.
type Config struct {
	// NetnsPath names the node's network namespace. Empty: the daemon's
	// own. Tests point it at a namespace they made.
	NetnsPath string
	// KubeletUID is the uid whose TCP to enrolled pods is SNATed.
	KubeletUID uint32
	// SourceV4 and SourceV6 are the probe sources; zero takes the defaults.
	SourceV4, SourceV6 netip.Addr
	// NoIPv4 and NoIPv6 leave out that family's rule (the daemon's probe
	// source flag for the family is empty). Not both.
	NoIPv4, NoIPv6 bool
	// Logger receives one line per change; the daemon passes
	// root.Named("probe").
	Logger hclog.Logger
}

// Manager keeps the node table in the node namespace true to the pods the
// daemon enrolled.
//
// It keeps in memory what it committed (address to owner UID) and what the
// calls so far want, and sends only the difference: an Add does not list
// the sets, and costs the same on a node with a thousand pods as with one.
// Changes are planned from a reading of the kernel only in Ensure and
// Reconcile, and after a batch the kernel refused (the table changed
// under the Manager), which is then planned again once from a fresh
// reading. Elements and Problems read the kernel for status only.
//
// All batches are sent by one goroutine, in order, over a netlink
// connection it keeps while busy: closing a netfilter socket after a
// deletion makes the closer wait for an RCU grace period (milliseconds),
// which a socket per call would pay on every removal. Changes made while a
// batch is in flight share the next one.
type Manager struct {
	path string
	rs   *Ruleset
	log  hclog.Logger

	// kmu is held by whoever talks to the kernel: the batch sender,
	// Ensure, Reconcile, Uninstall and the readers. It guards the
	// connection; batches thus reach the kernel in the order planned.
	// Taken before mu.
	kmu  sync.Mutex
	kc   *nftables.Conn
	kfd  int // the node namespace kc was opened in, while kc is open
	kend func()
	// lastUse and idle close the connection once unused for connLinger.
	lastUse time.Time
	idle    *time.Timer

	mu sync.Mutex
	// protects the following fields
	intent *intent
	// want is the sets' content after every call so far: each call
	// computes its changes against it, so ownership is right even before
	// the kernel has the previous call's changes.
	want *elemIndex
	// applied is what the kernel holds as far as the Manager knows: what
	// it read last, plus the batches committed since.
	applied map[netip.Addr]string
	// dirty lists the addresses where want may differ from applied.
	dirty map[netip.Addr]struct{}
	// synced: applied and the skeleton were read from the kernel and no
	// batch failed since, so a batch need not read the kernel first.
	synced bool
	// installed: the table has been in place since a batch of ours (or a
	// reading that found it right), so finding it otherwise is a repair.
	installed bool
	// next is the round that will carry the changes made since the last
	// batch was planned; nil when there are none to wait for.
	next *round
	// sending: the sender goroutine is running (or about to).
	sending bool
	// busy: a batch is being planned or sent.
	busy   bool
	closed bool

	stats counters
	// beforeSend, when set (tests only), runs after a batch is planned and
	// before it is sent, with kmu held and mu not.
	beforeSend func()
}

// connLinger is how long the connection outlives its last use: long enough
// for the grace period of the last deletion to pass, so that closing it
// rarely waits, and for a burst of calls to share it.
const connLinger = time.Second

// errClosed is returned by calls after Close.
var errClosed = errors.New("node probe table manager is closed")

// New checks cfg and that the node namespace can be opened; it does not
// touch nftables (Ensure or Reconcile does).
func New(cfg Config) (*Manager, error) {
	spec := Spec{KubeletUID: cfg.KubeletUID, SourceV4: cfg.SourceV4, SourceV6: cfg.SourceV6}
	if !spec.SourceV4.IsValid() {
		spec.SourceV4 = defaults.ProbeSourceV4()
	}
	if !spec.SourceV6.IsValid() {
		spec.SourceV6 = defaults.ProbeSourceV6()
	}
	if cfg.NoIPv4 {
		spec.SourceV4 = netip.Addr{}
	}
	if cfg.NoIPv6 {
		spec.SourceV6 = netip.Addr{}
	}
	rs, err := Build(spec)
	if err != nil {
		return nil, err
	}
	path := cfg.NetnsPath
	if path == "" {
		path = SelfNetns
	}
	fd, err := openNetns(path)
	if err != nil {
		return nil, err
	}
	unix.Close(fd)
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Manager{
		path: path, rs: rs, log: log,
		intent: newIntent(), want: newElemIndex(nil), applied: map[netip.Addr]string{}, dirty: map[netip.Addr]struct{}{},
	}, nil
}

// Addresses is how many pod addresses the sets hold, as far as the Manager
// knows (what it read last plus what it committed since); it does not
// read the kernel, so it is cheap enough for every metrics scrape.
func (m *Manager) Addresses() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.applied)
}

// Repairs counts the batches that restored the table after someone else
// changed it (the table, a set, the chain or an element of an enrolled
// pod: `nft flush ruleset`, a firewall reload that flushes everything),
// found by Ensure or Reconcile, or after a refused batch. Creating the
// table the first time is not a repair.
func (m *Manager) Repairs() int64 { return m.stats.repairs.Load() }

// Ruleset is the skeleton the Manager keeps in place.
func (m *Manager) Ruleset() *Ruleset { return m.rs }

// Ensure creates or repairs the table, sets and chain, and sends any
// changes still pending. Set contents are kept: a drifted chain is
// rewritten alone, and a set is recreated (seeded from the pods known to
// the Manager) only when it is missing or not a set of addresses. It
// changes nothing when all is in place.
func (m *Manager) Ensure(ctx context.Context) error {
	return m.exclusive(ctx, "ensure", modeRead)
}

// Add makes uid's addresses exactly addrs: each becomes an element owned
// by uid (re-owned if another pod held it: the latest add wins), and
// elements uid owned for addresses it no longer has are released. It
// returns once the kernel holds uid's elements, so probes work as soon as
// it returns; adds made meanwhile by other callers share the batch. When
// ctx ends first it returns ctx's error, and the change still follows.
// It repairs the skeleton only when the batch is refused; Ensure and
// Reconcile repair it otherwise.
func (m *Manager) Add(ctx context.Context, uid string, addrs []netip.Addr) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	clean, err := checkAddrs(addrs)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	m.intent.set(uid, clean)
	if !m.changeLocked(m.intent.afterAdd(m.want.ownedBy(uid), uid)) && m.committedLocked(uid, clean) {
		m.mu.Unlock()
		return nil
	}
	r := m.roundLocked()
	m.mu.Unlock()
	return r.wait(ctx)
}

// Remove releases uid: elements whose comment is uid are deleted, or
// handed to another enrolled pod that claims the same address. Elements
// owned by other pods are never touched. Removing an unknown pod succeeds.
//
// Remove does not wait for the kernel: the Manager's own picture changes
// at once (so an Add that follows, even of the same address by another
// pod, is planned against it), and the elements go with the next batch,
// shared by every removal made while the previous one was in flight.
// Flush waits for them. A batch that fails is logged and retried with the
// next call or reconcile.
func (m *Manager) Remove(ctx context.Context, uid string) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed
	}
	m.intent.remove(uid)
	if m.changeLocked(m.intent.afterRemove(m.want.ownedBy(uid), uid)) {
		m.roundLocked()
	}
	return nil
}

// Reconcile makes the node table exactly the skeleton plus pods' addresses:
// missing objects are created, foreign elements deleted, owners corrected.
// pods replaces everything the Manager knew, so the daemon passes every
// enrolled pod. It reads the kernel, and realigns the Manager's picture
// with what it finds.
func (m *Manager) Reconcile(ctx context.Context, pods map[string][]netip.Addr) error {
	clean := make(map[string][]netip.Addr, len(pods))
	for uid, addrs := range pods {
		if err := checkUID(uid); err != nil {
			return err
		}
		c, err := checkAddrs(addrs)
		if err != nil {
			return fmt.Errorf("pod %s: %w", uid, err)
		}
		clean[uid] = c
	}
	return m.exclusive(ctx, "reconcile", modeExact, func() { m.intent.replace(clean) })
}

// Flush waits until every change made before it is in the kernel (or its
// batch failed, whose error it returns). For tests and shutdown.
func (m *Manager) Flush(ctx context.Context) error {
	m.mu.Lock()
	if m.next == nil && !m.busy && len(m.dirty) == 0 {
		m.mu.Unlock()
		return nil
	}
	r := m.roundLocked()
	m.mu.Unlock()
	return r.wait(ctx)
}

// Close sends the pending changes, then closes the connection. Later
// changes fail; Elements, Problems and Uninstall still work.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	err := m.Flush(context.Background())
	m.kmu.Lock()
	m.unlockKernel()
	return err
}

// Uninstall deletes the table, and with it every element. It succeeds
// when the table is absent. The Manager forgets all pods; an Add still
// waiting fails.
func (m *Manager) Uninstall(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.kmu.Lock()
	defer m.unlockKernel()
	m.mu.Lock()
	m.intent = newIntent()
	m.want, m.applied, m.dirty, m.synced, m.installed = newElemIndex(nil), map[netip.Addr]string{}, map[netip.Addr]struct{}{}, false, false
	if r := m.next; r != nil {
		m.next = nil
		r.finish(errors.New("node probe table uninstalled"))
	}
	m.mu.Unlock()
	c, err := m.connLocked()
	if err != nil {
		return err
	}
	existed, err := nft.DeleteTable(c, nftables.TableFamilyINet, TableName)
	if !existed && err == nil {
		return nil
	}
	// A one-off: the grace period is paid here, not by a later caller.
	m.dropConnLocked()
	if err != nil {
		return fmt.Errorf("delete table %s in %s: %w", TableName, m.path, err)
	}
	m.log.Info("node probe table deleted", "netns", m.path)
	return nil
}

// Elements lists the addresses in the sets with their owners' UIDs, for
// status output and tests. It reads the kernel: removals still pending
// (see Remove) are listed.
func (m *Manager) Elements(ctx context.Context) (map[netip.Addr]string, error) {
	l, err := m.readOnly(ctx)
	if err != nil {
		return nil, err
	}
	return l.Elems, nil
}

// Problems lists how the live table differs from the skeleton (not its
// elements); none means in place.
func (m *Manager) Problems(ctx context.Context) ([]string, error) {
	l, err := m.readOnly(ctx)
	if err != nil {
		return nil, err
	}
	return l.Problems(&m.rs.Table), nil
}

func (m *Manager) readOnly(ctx context.Context) (*nft.Live, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.kmu.Lock()
	defer m.unlockKernel()
	c, err := m.connLocked()
	if err != nil {
		return nil, err
	}
	l, err := readLive(c, m.kfd, m.rs)
	if err != nil {
		m.dropConnLocked()
		return nil, fmt.Errorf("read node table in %s: %w", m.path, err)
	}
	return l, nil
}

// dial opens the node namespace and a netlink connection inside it; the
// returned func closes both. The namespace is opened per connection, so a
// path that changes is followed once the connection is idle. The fd is
// returned too: the table is read back over a socket of its own in the
// same namespace.
func (m *Manager) dial() (*nftables.Conn, int, func(), error) {
	fd, err := openNetns(m.path)
	if err != nil {
		return nil, 0, nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting(), nftables.WithSockOptions(largeSendBuffer))
	if err != nil {
		unix.Close(fd)
		return nil, 0, nil, fmt.Errorf("nftables in %s: %w", m.path, err)
	}
	return c, fd, func() { c.CloseLasting(); unix.Close(fd) }, nil
}

// sendBuffer bounds one batch: a batch goes out in a single sendmsg, which
// the kernel refuses (EMSGSIZE) beyond the socket's send buffer, and the
// default buffer (wmem_default, 208 KiB) holds the elements of only about
// a thousand dual-stack pods. The buffer is a limit, not an allocation.
const sendBuffer = 16 << 20

// largeSendBuffer raises the send buffer past wmem_max, which the daemon
// may (CAP_NET_ADMIN); without the capability it gets what wmem_max allows.
func largeSendBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer)
	}); err != nil || serr != nil {
		// Best effort: small batches need nothing more.
		_ = c.SetWriteBuffer(sendBuffer)
	}
	return nil
}

// checkUID holds the element comments to the pod-UID rule, which keeps
// them within the kernel's userdata limit.
func checkUID(uid string) error {
	if err := defaults.CheckPodUID(uid); err != nil {
		return fmt.Errorf("pod uid %w", err)
	}
	return nil
}

// checkAddrs unmaps, deduplicates and rejects addresses that cannot be a
// pod's.
func checkAddrs(addrs []netip.Addr) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() {
			return nil, fmt.Errorf("%v is not a pod address", a)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// openNetns opens a namespace file and checks it is a network namespace.
// The node namespace is not opened through a netns.Guard: the guard's
// job is to refuse exactly this namespace for pods.
func openNetns(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return -1, fmt.Errorf("open node namespace %s: %w", path, err)
	}
	nstype, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil || nstype != unix.CLONE_NEWNET {
		unix.Close(fd)
		if err == nil {
			err = unix.EINVAL
		}
		return -1, fmt.Errorf("node namespace %s is not a network namespace: %w", path, err)
	}
	return fd, nil
}
