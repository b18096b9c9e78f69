package netns

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/defaults"
)

// Routing is the policy routing that returns marked packets to local
// sockets: `ip rule add fwmark Mark/Mask pref Priority lookup Table` and
// `ip route add local default dev lo table Table`, per address family.
type Routing struct {
	Mark     uint32
	Mask     uint32
	Table    int
	Priority int
}

// DefaultRouting matches the in-pod routing ztunnel-compatible agents use:
// the tproxy mark, table and priority of package defaults.
func DefaultRouting() Routing {
	return Routing{Mark: defaults.TProxyMark, Mask: defaults.MarkMask, Table: defaults.RouteTable, Priority: defaults.RulePriority}
}

// Validate rejects values the kernel would refuse or misinterpret.
func (r Routing) Validate() error {
	switch {
	case r.Mask == 0:
		return errors.New("routing mark mask must not be zero")
	case r.Mark&^r.Mask != 0:
		return fmt.Errorf("routing mark %#x has bits outside mask %#x", r.Mark, r.Mask)
	case r.Table <= 0 || r.Table == unix.RT_TABLE_MAIN || r.Table == unix.RT_TABLE_LOCAL || r.Table == unix.RT_TABLE_DEFAULT || r.Table >= unix.RT_TABLE_MAX:
		return fmt.Errorf("route table %d is reserved or out of range", r.Table)
	case r.Priority <= 0 || r.Priority >= 32766:
		return fmt.Errorf("rule priority %d must be in 1..32765 (before the main table)", r.Priority)
	}
	return nil
}

// RoutingState says which families have the rule and route in place.
type RoutingState struct {
	V4Rule, V4Route bool
	V6Rule, V6Route bool
	// V6Capable is whether the namespace has IPv6 on its loopback at all.
	V6Capable bool
}

// Complete reports whether every family the namespace supports is set up.
func (s RoutingState) Complete() bool {
	if !s.V4Rule || !s.V4Route {
		return false
	}
	return !s.V6Capable || (s.V6Rule && s.V6Route)
}

// Absent reports whether none of our rules or routes exist.
func (s RoutingState) Absent() bool {
	return !s.V4Rule && !s.V4Route && !s.V6Rule && !s.V6Route
}

func (r Routing) rule(family int) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = family
	rule.Table = r.Table
	rule.Mark = r.Mark
	mask := r.Mask
	rule.Mask = &mask
	rule.Priority = r.Priority
	return rule
}

func (r Routing) route(family int, loIndex int) *netlink.Route {
	dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	if family == unix.AF_INET6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &netlink.Route{
		Family:    family,
		Dst:       dst,
		Type:      unix.RTN_LOCAL,
		Scope:     netlink.SCOPE_HOST,
		Table:     r.Table,
		LinkIndex: loIndex,
	}
}

// loopbackIndex is the loopback device's index in every network
// namespace: the kernel registers it first and it can be neither deleted
// nor moved. Its name is the pod's to change (`ip link set lo name x`),
// so it is never looked up by name.
const loopbackIndex = 1

// loopback finds the namespace's loopback device by index, checking that
// it is one.
func loopback(nh *netlink.Handle) (netlink.Link, error) {
	lo, err := nh.LinkByIndex(loopbackIndex)
	if err != nil {
		return nil, fmt.Errorf("find the loopback device (index %d): %w", loopbackIndex, err)
	}
	if lo.Attrs().Flags&net.FlagLoopback == 0 {
		return nil, fmt.Errorf("device %d (%s) is not a loopback device", loopbackIndex, lo.Attrs().Name)
	}
	return lo, nil
}

// families returns AF_INET and, when loopback has IPv6, AF_INET6. A
// namespace with IPv6 disabled refuses v6 routes, so it is skipped rather
// than failed.
func families(nh *netlink.Handle) (lo netlink.Link, fams []int, err error) {
	lo, err = loopback(nh)
	if err != nil {
		return nil, nil, err
	}
	fams = []int{unix.AF_INET}
	addrs, err := nh.AddrList(lo, unix.AF_INET6)
	if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return nil, nil, fmt.Errorf("list lo IPv6 addresses: %w", err)
	}
	if len(addrs) > 0 {
		fams = append(fams, unix.AF_INET6)
	}
	return lo, fams, nil
}

// Added is what one EnsureRouting call created in a namespace: the
// entries of Routing that were missing before it, and whether it brought
// loopback up. Undoing that call removes exactly these (RemoveAdded), so
// that an identical rule or route that was there first (istio-cni
// installs the same policy routing as ours, by default) stays where it
// was.
type Added struct {
	Routing         Routing
	V4Rule, V4Route bool
	V6Rule, V6Route bool
	// LoopbackUp: lo was down and the call brought it up.
	LoopbackUp bool
}

// Empty reports whether the call created nothing.
func (a Added) Empty() bool {
	return !a.V4Rule && !a.V4Route && !a.V6Rule && !a.V6Route && !a.LoopbackUp
}

func (a *Added) note(family int, rule, route bool) {
	if family == unix.AF_INET6 {
		a.V6Rule, a.V6Route = a.V6Rule || rule, a.V6Route || route
		return
	}
	a.V4Rule, a.V4Route = a.V4Rule || rule, a.V4Route || route
}

// EnsureRouting installs the local route and then the fwmark rule for each
// family (route first, so the rule never points at an empty table).
// Existing entries are left as they are; calling it twice is harmless. It
// reports what it created, also when it fails part way.
func EnsureRouting(h *Handle, r Routing) (Added, error) {
	added := Added{Routing: r}
	if err := r.Validate(); err != nil {
		return added, err
	}
	err := h.withRoute(func(nh *netlink.Handle) error { return ensureRouting(nh, r, &added, h.step) })
	return added, err
}

// The changes EnsureRouting makes, in its order, as a Guard's Fault sees
// them: lo brought up (only when down), then per family the local route
// and the fwmark rule.
const (
	StepLoopbackUp = "lo up"
	StepRouteV4    = "route v4"
	StepRuleV4     = "rule v4"
	StepRouteV6    = "route v6"
	StepRuleV6     = "rule v6"
)

// RoutingSteps lists the changes of an EnsureRouting in a namespace with
// IPv6 whose lo is up, in order.
var RoutingSteps = []string{StepRouteV4, StepRuleV4, StepRouteV6, StepRuleV6}

// step asks the guard's Fault, if any, whether the change named step may
// go ahead.
func (h *Handle) step(step string) error {
	if h.fault == nil {
		return nil
	}
	return h.fault(h.path, step)
}

func familyStep(family int, v4, v6 string) string {
	if family == unix.AF_INET6 {
		return v6
	}
	return v4
}

func ensureRouting(nh *netlink.Handle, r Routing, added *Added, step func(string) error) error {
	lo, err := loopback(nh)
	if err != nil {
		return err
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		// A local route through a down lo is rejected (ENETDOWN), and lo
		// only gets ::1 once up, which is how IPv6 is detected below.
		// Runtimes bring lo up in the sandbox; we do if it is not yet.
		// RemoveRouting leaves it up: a pod without a working loopback
		// is broken anyway, and nothing else may rely on it being down.
		// Only undoing this very call (RemoveAdded) takes it down again.
		if err := step(StepLoopbackUp); err != nil {
			return fmt.Errorf("bring up lo: %w", err)
		}
		if err := nh.LinkSetUp(lo); err != nil {
			return fmt.Errorf("bring up lo: %w", err)
		}
		added.LoopbackUp = true
	}
	lo, fams, err := families(nh)
	if err != nil {
		return err
	}
	for _, fam := range fams {
		want := r.route(fam, lo.Attrs().Index)
		if err := step(familyStep(fam, StepRouteV4, StepRouteV6)); err != nil {
			return fmt.Errorf("add local route (family %d, table %d): %w", fam, r.Table, err)
		}
		// Added exclusively, so that a route that is already there (ours
		// or another agent's identical one) is told apart from a new
		// one; a different route under the same key is replaced, as
		// the table's routes must be ours to work.
		switch err := nh.RouteAdd(want); {
		case err == nil:
			added.note(fam, false, true)
		case !errors.Is(err, unix.EEXIST):
			return fmt.Errorf("add local route (family %d, table %d): %w", fam, r.Table, err)
		default:
			same, lerr := hasRoute(nh, r, fam, lo.Attrs().Index)
			if lerr != nil {
				return lerr
			}
			if !same {
				if err := nh.RouteReplace(want); err != nil {
					return fmt.Errorf("replace local route (family %d, table %d): %w", fam, r.Table, err)
				}
				added.note(fam, false, true)
			}
		}
		if err := step(familyStep(fam, StepRuleV4, StepRuleV6)); err != nil {
			return fmt.Errorf("add fwmark rule (family %d): %w", fam, err)
		}
		switch err := nh.RuleAdd(r.rule(fam)); {
		case err == nil:
			added.note(fam, true, false)
		case !errors.Is(err, unix.EEXIST):
			return fmt.Errorf("add fwmark rule (family %d): %w", fam, err)
		}
	}
	return nil
}

// RemoveAdded undoes one EnsureRouting call: it deletes the rules, then
// the routes, that the call created, and takes loopback down again if the
// call brought it up. Entries that were there before the call are left.
func RemoveAdded(h *Handle, a Added) error {
	if a.Empty() {
		return nil
	}
	return h.withRoute(func(nh *netlink.Handle) error {
		var errs []error
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			rule, route := a.V4Rule, a.V4Route
			if fam == unix.AF_INET6 {
				rule, route = a.V6Rule, a.V6Route
			}
			if rule {
				if err := nh.RuleDel(a.Routing.rule(fam)); err != nil && !isGone(err) {
					errs = append(errs, fmt.Errorf("delete fwmark rule (family %d): %w", fam, err))
				}
			}
			if route {
				if err := nh.RouteDel(a.Routing.route(fam, 0)); err != nil && !isGone(err) {
					errs = append(errs, fmt.Errorf("delete local route (family %d): %w", fam, err))
				}
			}
		}
		if a.LoopbackUp {
			lo, err := loopback(nh)
			if err == nil {
				err = nh.LinkSetDown(lo)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("take lo down again: %w", err))
			}
		}
		return errors.Join(errs...)
	})
}

// RemoveRouting deletes the rule and then the route for each family. It
// succeeds when they are already gone, and needs nothing else from the
// namespace: whatever the pod did to it (renamed or downed its loopback,
// deleted our entries, added rules of its own at our priority), release
// must stay possible. Rules are matched on every attribute of ours, so a
// foreign rule at the same priority is left alone; the route is matched
// without its device.
func RemoveRouting(h *Handle, r Routing) error {
	return h.withRoute(func(nh *netlink.Handle) error { return removeRouting(nh, r) })
}

func removeRouting(nh *netlink.Handle, r Routing) error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		// The kernel deletes at most one matching rule per call; loop in
		// case an earlier crash or a bug left duplicates behind.
		for i := 0; i < 16; i++ {
			err := nh.RuleDel(r.rule(fam))
			if err != nil {
				if !isGone(err) {
					errs = append(errs, fmt.Errorf("delete fwmark rule (family %d): %w", fam, err))
				}
				break
			}
		}
		// The kernel deletes the first route matching what is given;
		// with no device (index 0) any device's matches.
		if err := nh.RouteDel(r.route(fam, 0)); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("delete local route (family %d): %w", fam, err))
		}
	}
	return errors.Join(errs...)
}

// InspectRouting reports what of our routing exists in the namespace.
func InspectRouting(h *Handle, r Routing) (RoutingState, error) {
	var st RoutingState
	err := h.withRoute(func(nh *netlink.Handle) (err error) {
		st, err = inspectRouting(nh, r)
		return err
	})
	return st, err
}

func inspectRouting(nh *netlink.Handle, r Routing) (RoutingState, error) {
	var st RoutingState
	lo, fams, err := families(nh)
	if err != nil {
		return st, err
	}
	st.V6Capable = len(fams) == 2
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := nh.RuleListFiltered(fam, r.rule(fam), netlink.RT_FILTER_TABLE|netlink.RT_FILTER_MARK|netlink.RT_FILTER_MASK|netlink.RT_FILTER_PRIORITY)
		if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
			return st, fmt.Errorf("list rules (family %d): %w", fam, err)
		}
		hasRoute, err := hasRoute(nh, r, fam, lo.Attrs().Index)
		if err != nil {
			return st, err
		}
		if fam == unix.AF_INET {
			st.V4Rule, st.V4Route = len(rules) > 0, hasRoute
		} else {
			st.V6Rule, st.V6Route = len(rules) > 0, hasRoute
		}
	}
	return st, nil
}

// hasRoute reports whether r's table holds the local default route
// through the loopback device loIndex for family.
func hasRoute(nh *netlink.Handle, r Routing, family, loIndex int) (bool, error) {
	routes, err := nh.RouteListFiltered(family, &netlink.Route{Table: r.Table}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return false, fmt.Errorf("list routes (family %d): %w", family, err)
	}
	for _, rt := range routes {
		isDefault := rt.Dst == nil
		if rt.Dst != nil {
			ones, _ := rt.Dst.Mask.Size()
			isDefault = ones == 0
		}
		if rt.Type == unix.RTN_LOCAL && rt.LinkIndex == loIndex && isDefault {
			return true, nil
		}
	}
	return false, nil
}

func isGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EAFNOSUPPORT)
}
