// Package capturetest holds what tests of the capture engine's callers
// need: Fake, an in-memory capture.Engine, and Run, the contract suite
// that holds the Fake and the kernel engine to the same behaviour. The
// lifecycle engine and the ZDS server test their logic on the Fake,
// without root, trusting only what the suite pins on both.
package capturetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Op names an Engine method, for counting calls and injecting failures.
type Op string

// The Engine's methods.
const (
	OpOpen          Op = "Open"
	OpApply         Op = "Apply"
	OpReroute       Op = "Reroute"
	OpRemove        Op = "Remove"
	OpRemoveRouting Op = "RemoveRouting"
	OpUndo          Op = "Undo"
	OpInspect       Op = "Inspect"
	OpOwner         Op = "Owner"
)

// HostPaths are the paths at which a new Fake has the node's own
// namespace, which Open refuses as the kernel engine's guard does.
var HostPaths = []string{"/proc/self/ns/net", "/proc/1/ns/net"}

// Fake is an in-memory capture.Engine; its Namespaces program its state. Tests register what exists at
// which path (AddNamespace, AddFile, ...), then hand the Fake to the code
// under test. State belongs to namespace identities, not paths, as in the
// kernel: a namespace opened before its path was deleted or replaced can
// still be worked on through that Namespace.
//
// What it models, as the contract suite checks on the kernel too: Apply
// installs routing then replaces the table atomically; the table is
// compared by its ruleset's digest (what the kernel engine's verify
// judges by, expression by expression); routing entries are keyed the way
// the kernel matches them (rules by family, mark, mask, table and
// priority; routes by family and table); Owner reads the pod from the
// table as its rule comments would tell it.
//
// Safe for concurrent use.
type Fake struct {
	mu sync.Mutex
	// protects the following fields
	paths      map[string]*entry
	nextCookie uint64
	fail       map[Op][]error
	calls      map[Op]int
	changes    int
	open       int
	takeOver   bool
}

var _ capture.Engine = (*Fake)(nil)

// entry is what a path leads to.
type entry struct {
	ns      *space // nil for a file that is not a namespace
	host    bool
	openErr error
}

// space is one network namespace's capture state.
type space struct {
	id netns.ID
	// file stands in for the namespace's nsfs file: an anonymous file
	// whose device and inode are the ID's, so an fd of it (dup'd by Open)
	// tells by fstat which namespace it names, as a real one does.
	file *os.File
	// table is the ruleset last applied; nil when there is no table.
	table *nft.Ruleset
	// edited and foreign say how the table was tampered with since:
	// rules edited in place (still carrying our comment), or a rule of
	// someone else's added (which no pod owns).
	edited, foreign bool
	rules           map[ruleKey]bool
	routes          map[routeKey]bool
	noIPv6          bool
	// others is another agent's capture in the namespace (nil: none).
	others *nft.Foreign
}

type ruleKey struct {
	family          int
	mark, mask      uint32
	table, priority int
}

type routeKey struct {
	family, table int
}

func ruleOf(family int, r netns.Routing) ruleKey {
	return ruleKey{family: family, mark: r.Mark, mask: r.Mask, table: r.Table, priority: r.Priority}
}

// NewFake returns a Fake with the node's namespace at HostPaths and
// nothing else.
func NewFake() *Fake {
	f := &Fake{paths: map[string]*entry{}, fail: map[Op][]error{}, calls: map[Op]int{}}
	host := f.newSpace()
	for _, p := range HostPaths {
		f.paths[p] = &entry{ns: host, host: true}
	}
	return f
}

func (f *Fake) newSpace() *space {
	fd, err := unix.MemfdCreate("capturetest-netns", unix.MFD_CLOEXEC)
	if err != nil {
		panic(fmt.Sprintf("capturetest: memfd_create: %v", err))
	}
	// os.File closes it once the Fake is garbage.
	file := os.NewFile(uintptr(fd), "capturetest-netns")
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		panic(fmt.Sprintf("capturetest: fstat memfd: %v", err))
	}
	return f.spaceOf(file, st.Dev, st.Ino)
}

func (f *Fake) spaceOf(file *os.File, dev, ino uint64) *space {
	// Cookies are never reused, as the kernel's.
	f.nextCookie++
	return &space{
		id:     netns.ID{Dev: dev, Ino: ino, Cookie: f.nextCookie},
		file:   file,
		rules:  map[ruleKey]bool{},
		routes: map[routeKey]bool{},
	}
}

// AddNamespace creates a new, empty network namespace at path (replacing
// whatever was there) and returns its identity.
func (f *Fake) AddNamespace(path string) netns.ID {
	f.mu.Lock()
	defer f.mu.Unlock()
	sp := f.newSpace()
	f.paths[path] = &entry{ns: sp}
	return sp.id
}

// DeleteNamespace removes path, as when a sandbox's namespace is
// unmounted and freed. Namespaces already open keep working.
func (f *Fake) DeleteNamespace(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.paths, path)
}

// ReplaceNamespace puts a new, empty namespace at path, as when a pod
// sandbox is recreated under the same name, and returns its identity.
// The new one has another inode and cookie.
func (f *Fake) ReplaceNamespace(path string) netns.ID { return f.AddNamespace(path) }

// ReplaceReusingInode puts a new, empty namespace at path that has the
// old one's device and inode but a new cookie: the kernel hands a freed
// namespace's inode number to the next one, and only the cookie tells
// them apart. The path must hold a namespace.
func (f *Fake) ReplaceReusingInode(path string) netns.ID {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.paths[path]
	if old == nil || old.ns == nil {
		panic(fmt.Sprintf("capturetest: ReplaceReusingInode(%q): no namespace there", path))
	}
	sp := f.spaceOf(old.ns.file, old.ns.id.Dev, old.ns.id.Ino)
	f.paths[path] = &entry{ns: sp}
	return sp.id
}

// AddFile makes path an existing file that is not a network namespace:
// Open fails with netns.ErrNotNetns.
func (f *Fake) AddFile(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paths[path] = &entry{}
}

// AddHost makes path lead to the node's own namespace: Open refuses it
// with netns.ErrHostNetns, as the guard refuses protected namespaces.
func (f *Fake) AddHost(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paths[path] = &entry{ns: f.paths[HostPaths[0]].ns, host: true}
}

// SetOpenError makes every Open of path fail with err until cleared with
// nil, for the guard's other refusals (wrap netns.ErrNoAccess or
// netns.ErrTimeout). The path need not be registered.
func (f *Fake) SetOpenError(path string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.paths[path]
	if e == nil {
		if err == nil {
			return
		}
		e = &entry{}
		f.paths[path] = e
	}
	e.openErr = err
	if err == nil && e.ns == nil && !e.host {
		// A path that existed only for its error goes away with it.
		delete(f.paths, path)
	}
}

// DisableIPv6 makes the namespace at path one without IPv6 on its
// loopback: routing is then installed and required for IPv4 only.
func (f *Fake) DisableIPv6(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mustSpace(path).noIPv6 = true
}

func (f *Fake) mustSpace(path string) *space {
	e := f.paths[path]
	if e == nil || e.ns == nil {
		panic(fmt.Sprintf("capturetest: no namespace at %q", path))
	}
	return e.ns
}

// FailNext makes the next call of op fail with err; calls queue up in
// order. An Apply fails at its table transaction, after the routing was
// installed, as a refused netlink batch does; a Reroute after the old
// routing was removed; the others before changing anything.
func (f *Fake) FailNext(op Op, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = append(f.fail[op], err)
}

// Calls is how often op was called, failed calls included.
func (f *Fake) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Changes counts the calls that changed any namespace's table or
// routing; tampering is not counted. A test that expects nothing to be
// programmed compares it before and after.
func (f *Fake) Changes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changes
}

// OpenNamespaces is how many Namespaces Open returned that are not yet
// closed, for tests that check nothing leaks.
func (f *Fake) OpenNamespaces() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open
}

// EditRule edits a rule of our table at path in place, keeping its
// comment, as `nft replace rule ... comment "<ours>"` does: the table
// drifts, but still names its pod. No-op without a table.
func (f *Fake) EditRule(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sp := f.mustSpace(path); sp.table != nil {
		sp.edited = true
	}
}

// AddForeignRule adds a rule without our comment to our table at path:
// the table drifts and can no longer be attributed to one pod. No-op
// without a table.
func (f *Fake) AddForeignRule(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sp := f.mustSpace(path); sp.table != nil {
		sp.foreign = true
	}
}

// SetTakeOver sets what Apply does with another agent's capture, as
// capture.TakeOverForeign does for the kernel engine.
func (f *Fake) SetTakeOver(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.takeOver = on
}

// AddForeignCapture puts another agent's capture, as FindForeign would
// describe it, into the namespace at path.
func (f *Fake) AddForeignCapture(path string, fc *nft.Foreign) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mustSpace(path).others = fc
}

// DeleteTable deletes our table at path, as `nft delete table` does.
func (f *Fake) DeleteTable(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sp := f.mustSpace(path)
	sp.table, sp.edited, sp.foreign = nil, false, false
}

// AddRouting installs r's rules and routes at path as another agent
// would, outside any Apply: istio-cni's policy routing is byte-equal to
// ours by default.
func (f *Fake) AddRouting(path string, r netns.Routing) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.mustSpace(path).ensureRouting(r); err != nil {
		panic(fmt.Sprintf("capturetest: AddRouting(%q): %v", path, err))
	}
}

// DeleteRule deletes r's fwmark rule of family (unix.AF_INET or
// AF_INET6) at path, as `ip rule del` does.
func (f *Fake) DeleteRule(path string, r netns.Routing, family int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.mustSpace(path).rules, ruleOf(family, r))
}

// DeleteRoute deletes the local default route of family in r's table at
// path, as `ip route del` does.
func (f *Fake) DeleteRoute(path string, r netns.Routing, family int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.mustSpace(path).routes, routeKey{family, r.Table})
}

// Table returns the ruleset last applied to the namespace at path and
// whether it was tampered with since; nil when there is no table.
func (f *Fake) Table(path string) (rs *nft.Ruleset, tampered bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sp := f.mustSpace(path)
	return sp.table, sp.edited || sp.foreign
}

// Routing says what of r exists in the namespace at path.
func (f *Fake) Routing(path string, r netns.Routing) netns.RoutingState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mustSpace(path).routing(r)
}

// Dump describes the namespace at path: table digest and tampering, and
// every rule and route, in a fixed order. Two dumps are equal when
// nothing in the namespace changed in between.
func (f *Fake) Dump(path string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mustSpace(path).dump()
}

func (sp *space) dump() string {
	var lines []string
	if sp.table != nil {
		lines = append(lines, fmt.Sprintf("table digest=%s edited=%t foreign=%t", sp.table.Digest, sp.edited, sp.foreign))
	}
	if !sp.others.Empty() {
		lines = append(lines, "others: "+sp.others.String())
	}
	for k := range sp.rules {
		lines = append(lines, fmt.Sprintf("rule family=%d fwmark %#x/%#x pref %d lookup %d", k.family, k.mark, k.mask, k.priority, k.table))
	}
	for k := range sp.routes {
		lines = append(lines, fmt.Sprintf("route family=%d local default dev lo table %d", k.family, k.table))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// Namespace is a namespace the Fake opened. Its Fd is a real open
// descriptor, so code that passes it on over SCM_RIGHTS works, and fstat
// of it (or of a copy received over a socket) gives the ID's Dev and Ino,
// as for a real namespace (see FileID); it is not a namespace, so
// NS_GET_NSTYPE fails on it.
type Namespace struct {
	f    *Fake
	path string
	sp   *space

	mu sync.Mutex
	// protects the following field
	fd int
}

var _ capture.Namespace = (*Namespace)(nil)

// Path is the path it was opened from.
func (n *Namespace) Path() string { return n.path }

// ID is the identity of the namespace it was opened on.
func (n *Namespace) ID() netns.ID { return n.sp.id }

// Fd is an open descriptor until Close, -1 after.
func (n *Namespace) Fd() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fd
}

// Close closes the descriptor. Safe to call twice.
func (n *Namespace) Close() error {
	n.mu.Lock()
	fd := n.fd
	n.fd = -1
	n.mu.Unlock()
	if fd < 0 {
		return nil
	}
	err := unix.Close(fd)
	// The Fake's lock is taken only after the Namespace's is released:
	// the Fake's methods take them in the other order.
	n.f.mu.Lock()
	n.f.open--
	n.f.mu.Unlock()
	return err
}

// begin counts a call of op and returns the failure queued for it.
// Callers hold f.mu.
func (f *Fake) begin(op Op) error {
	f.calls[op]++
	if q := f.fail[op]; len(q) > 0 {
		f.fail[op] = q[1:]
		return q[0]
	}
	return nil
}

// Open finds what path leads to and opens it, with the guard's errors.
func (f *Fake) Open(path string) (capture.Namespace, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpOpen); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%q: %w", path, netns.ErrNotAbsolute)
	}
	e := f.paths[path]
	switch {
	case e == nil:
		return nil, fmt.Errorf("%s: %w", path, netns.ErrNotExist)
	case e.openErr != nil:
		return nil, e.openErr
	case e.ns == nil:
		return nil, fmt.Errorf("%s is not a namespace file: %w", path, netns.ErrNotNetns)
	case e.host:
		return nil, fmt.Errorf("%s (%s): %w", path, e.ns.id, netns.ErrHostNetns)
	}
	fd, err := unix.FcntlInt(e.ns.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f.open++
	return &Namespace{f: f, path: path, sp: e.ns, fd: fd}, nil
}

// space returns the state behind n, refusing a closed namespace as the
// kernel refuses a closed descriptor. Callers hold n.f.mu.
func (n *Namespace) space() (*space, error) {
	if n.Fd() < 0 {
		return nil, fmt.Errorf("namespace %s: %w", n.path, unix.EBADF)
	}
	return n.sp, nil
}

// ensureRouting is netns.EnsureRouting: route, then rule, per family
// the namespace has; existing entries stay, and what was created is
// reported.
func (sp *space) ensureRouting(r netns.Routing) (netns.Added, error) {
	added := netns.Added{Routing: r}
	if err := r.Validate(); err != nil {
		return added, err
	}
	for _, fam := range sp.families() {
		var rule, route bool
		if rk := (routeKey{fam, r.Table}); !sp.routes[rk] {
			sp.routes[rk], route = true, true
		}
		if k := ruleOf(fam, r); !sp.rules[k] {
			sp.rules[k], rule = true, true
		}
		if fam == unix.AF_INET6 {
			added.V6Rule, added.V6Route = rule, route
		} else {
			added.V4Rule, added.V4Route = rule, route
		}
	}
	return added, nil
}

// removeAdded is netns.RemoveAdded: only the entries a are about.
func (sp *space) removeAdded(a netns.Added) (changed bool) {
	del := func(ok bool, fam int) {
		if !ok {
			return
		}
		if k := ruleOf(fam, a.Routing); sp.rules[k] {
			delete(sp.rules, k)
			changed = true
		}
	}
	delRoute := func(ok bool, fam int) {
		if rk := (routeKey{fam, a.Routing.Table}); ok && sp.routes[rk] {
			delete(sp.routes, rk)
			changed = true
		}
	}
	del(a.V4Rule, unix.AF_INET)
	del(a.V6Rule, unix.AF_INET6)
	delRoute(a.V4Route, unix.AF_INET)
	delRoute(a.V6Route, unix.AF_INET6)
	return changed
}

// removeRouting is netns.RemoveRouting: both families, whatever exists.
func (sp *space) removeRouting(r netns.Routing) (changed bool) {
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		if k := ruleOf(fam, r); sp.rules[k] {
			delete(sp.rules, k)
			changed = true
		}
		if rk := (routeKey{fam, r.Table}); sp.routes[rk] {
			delete(sp.routes, rk)
			changed = true
		}
	}
	return changed
}

func (sp *space) families() []int {
	if sp.noIPv6 {
		return []int{unix.AF_INET}
	}
	return []int{unix.AF_INET, unix.AF_INET6}
}

func (sp *space) routing(r netns.Routing) netns.RoutingState {
	return netns.RoutingState{
		V4Rule:    sp.rules[ruleOf(unix.AF_INET, r)],
		V4Route:   sp.routes[routeKey{unix.AF_INET, r.Table}],
		V6Rule:    sp.rules[ruleOf(unix.AF_INET6, r)],
		V6Route:   sp.routes[routeKey{unix.AF_INET6, r.Table}],
		V6Capable: !sp.noIPv6,
	}
}

// Apply installs r, then replaces the table with rs; a table already
// exactly rs is left alone, as the kernel engine does.
func (n *Namespace) Apply(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (capture.Change, error) {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	var c capture.Change
	injected := f.begin(OpApply)
	sp, err := n.space()
	if err != nil {
		return c, err
	}
	if rs == nil {
		return c, errors.New("capture: apply of a nil ruleset")
	}
	if err := capture.CheckForeign(n.Path(), sp.others, f.takeOver); err != nil {
		return c, err
	}
	c.Routing, err = sp.ensureRouting(r)
	changed := !c.Routing.Empty()
	if changed {
		f.changes++
	}
	if err != nil {
		return c, fmt.Errorf("install policy routing: %w", err)
	}
	// The kernel engine checks the context only once the routing is in.
	if err := ctx.Err(); err != nil {
		return c, err
	}
	if injected != nil {
		return c, injected
	}
	c.Table, c.TookOver = true, !sp.others.Empty()
	if sp.table != nil && sp.table.Digest == rs.Digest && !sp.edited && !sp.foreign && sp.others.Empty() {
		return c, nil
	}
	sp.table, sp.edited, sp.foreign, sp.others = rs, false, false, nil
	if !changed {
		// One call, one change, however much of it changed.
		f.changes++
	}
	return c, nil
}

// Undo deletes the table if the Apply wrote it, then the routing it
// created.
func (n *Namespace) Undo(ctx context.Context, c capture.Change) error {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	injected := f.begin(OpUndo)
	sp, err := n.space()
	if err != nil {
		return err
	}
	if injected != nil {
		return injected
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	changed := false
	if c.Table && sp.table != nil {
		sp.table, sp.edited, sp.foreign = nil, false, false
		changed = true
	}
	if sp.removeAdded(c.Routing) || changed {
		f.changes++
	}
	return nil
}

// Reroute removes old, then installs r.
func (n *Namespace) Reroute(_ context.Context, old, r netns.Routing) error {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	injected := f.begin(OpReroute)
	sp, err := n.space()
	if err != nil {
		return err
	}
	// An injected failure is the old routing's removal failing; the new
	// routing is ensured all the same, as the kernel engine does.
	changed := sp.removeRouting(old)
	added, err := sp.ensureRouting(r)
	if changed || !added.Empty() {
		f.changes++
	}
	if err != nil {
		return errors.Join(injected, fmt.Errorf("install policy routing: %w", err))
	}
	return injected
}

// Remove deletes the table, then r's routing; absent parts are fine.
func (n *Namespace) Remove(ctx context.Context, r netns.Routing) error {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	injected := f.begin(OpRemove)
	sp, err := n.space()
	if err != nil {
		return err
	}
	if injected != nil {
		return injected
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	changed := sp.table != nil
	sp.table, sp.edited, sp.foreign = nil, false, false
	if sp.removeRouting(r) || changed {
		f.changes++
	}
	return nil
}

// RemoveRouting deletes r's routing only.
func (n *Namespace) RemoveRouting(_ context.Context, r netns.Routing) error {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	injected := f.begin(OpRemoveRouting)
	sp, err := n.space()
	if err != nil {
		return err
	}
	if injected != nil {
		return injected
	}
	if sp.removeRouting(r) {
		f.changes++
	}
	return nil
}

// Inspect compares the namespace with rs and r. The text of an in-sync
// table is rs's own rendering, which the kernel's listing matches; a
// drifted one ends with a "# drift:" line as the kernel engine's does.
func (n *Namespace) Inspect(ctx context.Context, rs *nft.Ruleset, r netns.Routing) (capture.Live, error) {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	injected := f.begin(OpInspect)
	sp, err := n.space()
	if err != nil {
		return capture.Live{}, err
	}
	if injected != nil {
		return capture.Live{}, injected
	}
	if err := ctx.Err(); err != nil {
		return capture.Live{}, err
	}
	live := capture.Live{Table: nft.StatusAbsent, Routing: sp.routing(r)}
	if !sp.others.Empty() {
		live.Foreign = sp.others.String()
	}
	if sp.table == nil {
		return live, nil
	}
	var drift []string
	if sp.table.Digest != rs.Digest {
		drift = append(drift, fmt.Sprintf("the table was built as digest %s, want %s", sp.table.Digest, rs.Digest))
	}
	if sp.edited {
		drift = append(drift, "a rule was edited")
	}
	if sp.foreign {
		drift = append(drift, "a rule is not ours")
	}
	if len(drift) == 0 {
		live.Table, live.Text = nft.StatusInSync, rs.String()
		return live, nil
	}
	live.Table = nft.StatusDrifted
	live.Text = sp.table.String() + "# drift: " + strings.Join(drift, "; ") + "\n"
	return live, nil
}

// Owner returns the pod the table was built for, or "" when a foreign
// rule makes it unattributable.
func (n *Namespace) Owner(ctx context.Context) (string, bool, error) {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	injected := f.begin(OpOwner)
	sp, err := n.space()
	if err != nil {
		return "", false, err
	}
	if injected != nil {
		return "", false, injected
	}
	if err := ctx.Err(); err != nil {
		return "", false, err
	}
	switch {
	case sp.table == nil:
		return "", false, nil
	case sp.foreign:
		return "", true, nil
	}
	return sp.table.Spec.PodID, true, nil
}

// Candidates lists every registered path, sorted. Like the kernel's list
// it includes paths Open refuses (the node's own, files, failing ones).
func (f *Fake) Candidates() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	paths := make([]string, 0, len(f.paths))
	for p := range f.paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

// FileID returns the device and inode of the file fd refers to, as an ID
// without a cookie: for an fd of a namespace of either engine (or one
// received from a Namespace's Fd over SCM_RIGHTS) it is SameFile as the
// namespace's ID.
func FileID(fd int) (netns.ID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return netns.ID{}, fmt.Errorf("fstat fd %d: %w", fd, err)
	}
	return netns.ID{Dev: st.Dev, Ino: st.Ino}, nil
}
