package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// SelfNetns is the daemon's own network namespace, the node's by default.
const SelfNetns = "/proc/self/ns/net"

// maxUIDLen bounds the element comment; the kernel's userdata limit is 256
// bytes and a pod UID is 36.
const maxUIDLen = 128

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
// daemon enrolled. Every method changes the kernel in at most one netlink
// batch, and calls are serialised: the table is shared by all pods.
type Manager struct {
	path string
	rs   *Ruleset
	log  hclog.Logger

	mu sync.Mutex
	// protects the following fields
	intent *intent
}

// New checks cfg and that the node namespace can be opened; it does not
// touch nftables (Ensure or Reconcile does).
func New(cfg Config) (*Manager, error) {
	spec := Spec{KubeletUID: cfg.KubeletUID, SourceV4: cfg.SourceV4, SourceV6: cfg.SourceV6}
	if !spec.SourceV4.IsValid() {
		spec.SourceV4 = DefaultSourceV4
	}
	if !spec.SourceV6.IsValid() {
		spec.SourceV6 = DefaultSourceV6
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
	return &Manager{path: path, rs: rs, log: log, intent: newIntent()}, nil
}

// Ruleset is the skeleton the Manager keeps in place.
func (m *Manager) Ruleset() *Ruleset { return m.rs }

// Ensure creates or repairs the table, sets and chain. Set contents are
// kept: a drifted chain is rewritten alone, and a set is recreated (seeded
// from the pods known to the Manager) only when it is missing or not a set
// of addresses. It changes nothing when all is in place.
func (m *Manager) Ensure(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.apply(ctx, "ensure", func(map[netip.Addr]string) changes { return nil })
}

// Add makes uid's addresses exactly addrs: each becomes an element owned
// by uid (re-owned if another pod held it: the latest add wins), and
// elements uid owned for addresses it no longer has are released. It also
// repairs the skeleton if needed.
func (m *Manager) Add(ctx context.Context, uid string, addrs []netip.Addr) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	clean, err := checkAddrs(addrs)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.intent.set(uid, clean)
	return m.apply(ctx, "add "+uid, func(live map[netip.Addr]string) changes { return m.intent.afterAdd(live, uid) })
}

// Remove releases uid: elements whose comment is uid are deleted, or
// handed to another enrolled pod that claims the same address. Elements
// owned by other pods are never touched. Removing an unknown pod succeeds.
func (m *Manager) Remove(ctx context.Context, uid string) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.intent.remove(uid)
	return m.apply(ctx, "remove "+uid, func(live map[netip.Addr]string) changes { return m.intent.afterRemove(live, uid) })
}

// Reconcile makes the node table exactly the skeleton plus pods' addresses:
// missing objects are created, foreign elements deleted, owners corrected.
// pods replaces everything the Manager knew, so the daemon passes every
// enrolled pod.
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
	m.mu.Lock()
	defer m.mu.Unlock()
	m.intent.replace(clean)
	return m.apply(ctx, "reconcile", m.intent.exact)
}

// Uninstall deletes the table, and with it every element. It succeeds
// when the table is absent. The Manager forgets all pods.
func (m *Manager) Uninstall(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.intent = newIntent()
	c, done, err := m.conn(ctx)
	if err != nil {
		return err
	}
	defer done()
	// Deleting makes the kernel wait for an RCU grace period; look first.
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); errors.Is(err, unix.ENOENT) {
		return nil
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete table %s in %s: %w", TableName, m.path, err)
	}
	m.log.Info("node probe table deleted", "netns", m.path)
	return nil
}

// Elements lists the addresses in the sets with their owners' UIDs, for
// status output and tests.
func (m *Manager) Elements(ctx context.Context) (map[netip.Addr]string, error) {
	c, done, err := m.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	l, err := readLive(c, m.rs)
	if err != nil {
		return nil, fmt.Errorf("read node table in %s: %w", m.path, err)
	}
	return l.elems, nil
}

// Problems lists how the live table differs from the skeleton (not its
// elements); none means in place.
func (m *Manager) Problems(ctx context.Context) ([]string, error) {
	c, done, err := m.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	l, err := readLive(c, m.rs)
	if err != nil {
		return nil, fmt.Errorf("read node table in %s: %w", m.path, err)
	}
	return l.problems(m.rs), nil
}

// conn opens the node namespace and a netlink connection inside it; done
// closes both. The namespace is opened per call, so a path that changes
// is followed and no fd outlives the call.
func (m *Manager) conn(ctx context.Context) (*nftables.Conn, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	fd, err := openNetns(m.path)
	if err != nil {
		return nil, nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting())
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables in %s: %w", m.path, err)
	}
	return c, func() { c.CloseLasting(); unix.Close(fd) }, nil
}

// apply reads the live table, lets elems decide the element changes from
// the live elements, and sends one batch with whatever is needed. A batch
// that fails because the table changed under it (another program editing
// the node ruleset) is planned again once from a fresh reading.
func (m *Manager) apply(ctx context.Context, what string, elems func(live map[netip.Addr]string) changes) error {
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		// A fresh connection per attempt: v0.3.0 keeps a failed batch's
		// error on the connection forever.
		c, done, err := m.conn(ctx)
		if err != nil {
			return err
		}
		l, err := readLive(c, m.rs)
		if err != nil {
			done()
			return fmt.Errorf("%s: read node table in %s: %w", what, m.path, err)
		}
		b := plan(l, m.rs, elems(l.elems), m.intent.seed)
		if b.empty() {
			done()
			return nil
		}
		err = b.queue(c)
		if err == nil {
			err = c.Flush()
		}
		done()
		if err == nil {
			b.log(m.log.With("op", what, "netns", m.path))
			return nil
		}
		lastErr = err
	}
	return fmt.Errorf("%s: node table in %s: %w", what, m.path, lastErr)
}

func checkUID(uid string) error {
	if uid == "" {
		return errors.New("pod uid is empty")
	}
	if len(uid) > maxUIDLen {
		return fmt.Errorf("pod uid is %d bytes long (at most %d)", len(uid), maxUIDLen)
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
