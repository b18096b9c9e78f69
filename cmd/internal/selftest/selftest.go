// Package selftest checks that the running kernel has what nftredir's
// rulesets need (nf_tables, conntrack, socket, tproxy, redirect, NAT, sets,
// policy routing), by programming them into a scratch network namespace
// that the check creates and throws away. The daemon runs it before it
// serves, so a kernel without, say, nft_tproxy is a startup error naming
// the module instead of a daemon that fails every AddPod; `nftredirctl
// doctor` prints the same checks.
package selftest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/probe"
)

// Config is what the rulesets under test are built from: the daemon's
// defaults, or nftredir's own defaults for doctor.
type Config struct {
	// Spec is the default pod spec; both capture modes are checked, with
	// DNS capture on, whatever Spec.Mode and Spec.CaptureDNS say.
	Spec nft.Spec
	// Routing is the pods' policy routing.
	Routing netns.Routing
	// Probe is the node probe table's spec; nil skips that check (the
	// daemon runs without the table).
	Probe *probe.Spec
}

// DefaultConfig is nftredir's defaults, node probe table included.
func DefaultConfig() Config {
	ps := probe.DefaultSpec()
	return Config{Spec: nft.DefaultSpec("selftest"), Routing: netns.DefaultRouting(), Probe: &ps}
}

// Check is one kernel feature.
type Check struct {
	// Name says what is checked, e.g. "tproxy".
	Name string
	// Modules are the kernel modules (or build options) that provide it,
	// the first being the one to load.
	Modules []string
	// Remedy, when set, is the hint for a failure that no module fixes.
	Remedy string
	run    func(ctx context.Context, ns *scratch) error
}

// Result is the outcome of one Check.
type Result struct {
	Name    string
	Modules []string
	Remedy  string
	// Err is nil when the kernel accepted what the check programmed.
	Err      error
	Duration time.Duration
}

// Hint is the remedy printed with a failure.
func (r Result) Hint() string {
	if r.Remedy != "" {
		return r.Remedy
	}
	if len(r.Modules) == 0 {
		return ""
	}
	if strings.HasPrefix(r.Modules[0], "CONFIG_") {
		return "the kernel needs " + strings.Join(r.Modules, ", ")
	}
	return fmt.Sprintf("needs kernel module %s (modprobe %s)", strings.Join(r.Modules, ", "), r.Modules[0])
}

// Error is the self-test's failure: every check that failed, each naming
// what the kernel lacks.
type Error struct{ Failed []Result }

func (e *Error) Error() string {
	parts := make([]string, len(e.Failed))
	for i, r := range e.Failed {
		parts[i] = fmt.Sprintf("%s: %v; %s", r.Name, r.Err, r.Hint())
	}
	return "kernel self-test failed: " + strings.Join(parts, "; ")
}

// Run creates a scratch namespace, runs every check in it in order, and
// returns every result. The error is an *Error when a check failed, or
// the reason the scratch namespace could not be made.
func Run(ctx context.Context, checks []Check) ([]Result, error) {
	ns, err := newScratch()
	if err != nil {
		return nil, err
	}
	defer ns.close()
	var results []Result
	var failed []Result
	for _, c := range checks {
		if err := ctx.Err(); err != nil {
			return results, err
		}
		start := time.Now()
		err := c.run(ctx, ns)
		r := Result{Name: c.Name, Modules: c.Modules, Remedy: c.Remedy, Err: err, Duration: time.Since(start)}
		results = append(results, r)
		if err != nil {
			failed = append(failed, r)
		}
	}
	if len(failed) > 0 {
		return results, &Error{Failed: failed}
	}
	return results, nil
}

// scratch is a network namespace of the self-test's own, reachable only
// through its fd: nothing else can see it, and it vanishes with the fd.
type scratch struct {
	fd   int
	path string
	h    *netns.Handle
	// srcValidMark names the net.ipv4.conf.{all,default}.src_valid_mark
	// set in the new namespace: what a pod's namespace copies from the
	// node by default (net.core.devconf_inherit_init_net=0).
	srcValidMark []string
}

// newScratch makes a namespace on a thread of its own, keeps an fd to it,
// and lets the thread die with its goroutine (it is never unlocked, so
// the Go runtime discards it rather than reuse a thread in another
// namespace).
func newScratch() (*scratch, error) {
	ch := make(chan scratchResult, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			unshareScratch(ch)
			return
		}
		// The main thread must stay in the node's namespace: the runtime
		// cannot discard it, and /proc/self/ns/net, which the guard takes
		// for the daemon's own namespace, is its namespace. Held locked
		// here, it cannot run the goroutine that unshares.
		inner := make(chan scratchResult, 1)
		go unshareScratch(inner)
		r := <-inner
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	ns := &scratch{fd: r.fd, path: fmt.Sprintf("/proc/self/fd/%d", r.fd), srcValidMark: r.srcValidMark}
	// Opened through the guard like a pod's namespace, so the pod code
	// paths run unchanged; the guard also proves this is not the node's.
	g, err := netns.NewGuard()
	if err == nil {
		ns.h, err = g.Open(ns.path)
	}
	if err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("open the scratch network namespace: %w", err)
	}
	return ns, nil
}

func (ns *scratch) close() {
	ns.h.Close()
	unix.Close(ns.fd)
}

func (ns *scratch) conn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithNetNSFd(ns.fd))
}

// apply sends one table holding chain with rules, through the engine the
// daemon programs its tables with. Each check has its own table, so one's
// leftovers cannot make another pass or fail.
func (ns *scratch) apply(name string, ch nft.Chain, rules ...nft.Rule) error {
	c, err := ns.conn()
	if err != nil {
		return err
	}
	ch.Rules = rules
	t := &nft.Table{Name: "selftest-" + name, Family: nftables.TableFamilyINet, Label: "nftredir selftest", Chains: []nft.Chain{ch}}
	if err := t.Encode(); err != nil {
		return err
	}
	if err := nft.Create(t, nil).Queue(c); err != nil {
		return err
	}
	return c.Flush()
}

// Checks is the standard list for cfg, in an order where each check needs
// only what the ones before it proved: the single features first, so that
// a failure names the missing piece, then the complete rulesets exactly as
// a pod and the node get them.
func Checks(cfg Config) ([]Check, error) {
	defaultMode := cfg.Spec.Mode
	spec := cfg.Spec
	spec.PodID = "selftest"
	spec.CaptureDNS = true
	spec.Mode = nft.ModeTProxy
	tproxyRS, err := nft.Build(spec)
	if err != nil {
		return nil, fmt.Errorf("self-test: %w", err)
	}
	spec.Mode = nft.ModeRedirect
	redirectRS, err := nft.Build(spec)
	if err != nil {
		return nil, fmt.Errorf("self-test: %w", err)
	}
	both := []*nft.Ruleset{tproxyRS, redirectRS}
	checks := []Check{
		chainCheck("nf_tables", []string{"nf_tables"}, nftables.ChainTypeFilter),
		chainCheck("nat chains", []string{"nft_chain_nat", "nf_nat"}, nftables.ChainTypeNAT),
		chainCheck("route chains", []string{"nf_tables"}, nftables.ChainTypeRoute),
	}
	for _, f := range features {
		ch, r, ok := firstRule(both, f.has)
		if !ok {
			continue
		}
		checks = append(checks, Check{Name: f.name, Modules: f.modules, run: func(_ context.Context, ns *scratch) error {
			return ns.apply(strings.ReplaceAll(f.name, " ", "-"), ch, r)
		}})
	}
	checks = append(checks,
		Check{Name: "policy routing", Modules: []string{"CONFIG_IP_MULTIPLE_TABLES", "CONFIG_IPV6_MULTIPLE_TABLES"}, run: func(_ context.Context, ns *scratch) error {
			_, err := netns.EnsureRouting(ns.h, cfg.Routing)
			return err
		}},
		rulesetCheck("pod table (TPROXY mode)", tproxyRS),
		rulesetCheck("pod table (REDIRECT mode)", redirectRS),
	)
	if cfg.Probe != nil {
		checks = append(checks, probeCheck(*cfg.Probe))
	}
	if defaultMode == nft.ModeTProxy {
		checks = append(checks, srcValidMarkCheck())
	}
	return checks, nil
}

// srcValidMarkCheck fails where TPROXY capture cannot work: with
// src_valid_mark set, source validation looks the client's address up
// with the packet's mark, the tproxy mark leads to the local route of the
// pods' table 100, and every tproxied SYN is dropped as martian
// (istio#52576; e2e TestSrcValidMark shows it with real TCP). New pod
// namespaces copy the node's value, as the scratch namespace does. It is
// checked only when TPROXY is the daemon's default mode.
func srcValidMarkCheck() Check {
	return Check{
		Name:   "TPROXY source validation",
		Remedy: "TPROXY capture drops every inbound connection on this node; run with --capture-mode redirect (or set src_valid_mark=0)",
		run: func(_ context.Context, ns *scratch) error {
			if len(ns.srcValidMark) > 0 {
				return fmt.Errorf("%s is 1 in a new network namespace, as pods get it", strings.Join(ns.srcValidMark, " and "))
			}
			return nil
		},
	}
}

// chainCheck creates an empty base chain of type t.
func chainCheck(name string, modules []string, t nftables.ChainType) Check {
	hook := nftables.ChainHookOutput
	return Check{Name: name, Modules: modules, run: func(_ context.Context, ns *scratch) error {
		return ns.apply(strings.ReplaceAll(name, " ", "-"), nft.Chain{Name: "c", Type: t, Hook: hook})
	}}
}

// feature is an expression of the rulesets, found in them by has: the
// check applies the first rule that has it, alone in a copy of its chain.
type feature struct {
	name    string
	modules []string
	has     func(expr.Any) bool
}

var features = []feature{
	{"basic matches (meta, payload, bitwise)", []string{"nf_tables"}, func(e expr.Any) bool {
		// The rule chosen is one made only of these, with its verdict.
		switch e.(type) {
		case *expr.Meta, *expr.Payload, *expr.Cmp, *expr.Bitwise:
			return true
		}
		return false
	}},
	{"conntrack (ct state, ct mark)", []string{"nft_ct", "nf_conntrack"}, func(e expr.Any) bool {
		c, ok := e.(*expr.Ct)
		return ok && !c.SourceRegister
	}},
	{"conntrack set (ct mark set, ct zone set)", []string{"nft_ct", "CONFIG_NF_CONNTRACK_MARK", "CONFIG_NF_CONNTRACK_ZONES"}, func(e expr.Any) bool {
		c, ok := e.(*expr.Ct)
		return ok && c.SourceRegister
	}},
	{"socket", []string{"nft_socket", "nf_socket_ipv4", "nf_socket_ipv6"}, isType[*expr.Socket]},
	{"tproxy", []string{"nft_tproxy", "nf_tproxy_ipv4", "nf_tproxy_ipv6"}, isType[*expr.TProxy]},
	{"redirect", []string{"nft_redir"}, isType[*expr.Redir]},
}

func isType[T expr.Any](e expr.Any) bool {
	_, ok := e.(T)
	return ok
}

// basicTypes are what every rule is built from besides its feature.
var basicTypes = map[reflect.Type]bool{
	reflect.TypeFor[*expr.Meta]():      true,
	reflect.TypeFor[*expr.Payload]():   true,
	reflect.TypeFor[*expr.Cmp]():       true,
	reflect.TypeFor[*expr.Bitwise]():   true,
	reflect.TypeFor[*expr.Immediate](): true,
	reflect.TypeFor[*expr.Verdict]():   true,
}

// firstRule finds the first rule with an expression has accepts. For the
// basic-match feature (has accepts a basic type) it wants a rule of basic
// expressions only, so that the check proves exactly those.
func firstRule(sets []*nft.Ruleset, has func(expr.Any) bool) (nft.Chain, nft.Rule, bool) {
	onlyBasic := has(&expr.Meta{})
	for _, rs := range sets {
		for _, ch := range rs.Chains {
			for _, r := range ch.Rules {
				found, basic := false, true
				for _, e := range r.Exprs {
					found = found || has(e)
					basic = basic && basicTypes[reflect.TypeOf(e)]
				}
				if found && (!onlyBasic || basic) {
					return ch, r, true
				}
			}
		}
	}
	return nft.Chain{}, nft.Rule{}, false
}

// rulesetCheck applies a complete pod ruleset with the daemon's own
// applier, as AddPod does.
func rulesetCheck(name string, rs *nft.Ruleset) Check {
	return Check{Name: name, Modules: []string{"nf_tables"}, run: func(ctx context.Context, ns *scratch) error {
		return nft.NewNetlink().Apply(ctx, ns.h, rs)
	}}
}

// probeCheck creates the node probe table and adds an address to its set,
// as the daemon does on the node.
func probeCheck(spec probe.Spec) Check {
	return Check{Name: "node probe table (sets, snat, meta skuid)", Modules: []string{"nft_nat", "nf_tables"}, run: func(ctx context.Context, ns *scratch) error {
		m, err := probe.New(probe.Config{
			NetnsPath: ns.path, KubeletUID: spec.KubeletUID,
			SourceV4: spec.SourceV4, SourceV6: spec.SourceV6,
			NoIPv4: !spec.SourceV4.IsValid(), NoIPv6: !spec.SourceV6.IsValid(),
		})
		if err != nil {
			return err
		}
		err = m.Ensure(ctx)
		if err == nil {
			err = m.Add(ctx, "selftest", []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")})
		}
		return errors.Join(err, m.Close())
	}}
}

// loUp brings the current thread's namespace's loopback up, as in any pod:
// policy routing's local route goes through it.
func loUp() error {
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("scratch network namespace: %w", err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("scratch network namespace: bring lo up: %w", err)
	}
	return nil
}

type scratchResult struct {
	fd           int
	err          error
	srcValidMark []string
}

// unshareScratch runs as its own goroutine, which ends with its thread
// still locked in the new namespace.
func unshareScratch(ch chan<- scratchResult) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		ch <- scratchResult{fd: -1, err: errors.New("create a scratch network namespace: would move the main thread")}
		return
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		ch <- scratchResult{fd: -1, err: fmt.Errorf("create a scratch network namespace: %w", err)}
		return
	}
	if err := loUp(); err != nil {
		ch <- scratchResult{fd: -1, err: err}
		return
	}
	// /proc/sys/net shows the namespace of the thread that opens it.
	var marks []string
	for _, conf := range []string{"all", "default"} {
		if b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + conf + "/src_valid_mark"); err == nil && strings.TrimSpace(string(b)) != "0" {
			marks = append(marks, "net.ipv4.conf."+conf+".src_valid_mark")
		}
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		err = fmt.Errorf("open the scratch network namespace: %w", err)
	}
	ch <- scratchResult{fd, err, marks}
}
