package capturetest

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Env is one engine plus the means to shape and tamper with the world it
// works on. NewFakeEnv and NewKernelEnv implement it; Run holds both to
// the same cases, so what the lifecycle relies on is pinned on the kernel
// and on the Fake alike.
type Env interface {
	Engine() capture.Engine
	// NewNamespace creates an empty network namespace and returns its
	// path; it is gone when the test ends.
	NewNamespace(t *testing.T) string
	// DeleteNamespace removes the namespace at path.
	DeleteNamespace(t *testing.T, path string)
	// ReplaceNamespace puts a new, empty namespace at path.
	ReplaceNamespace(t *testing.T, path string)
	// NotNamespace returns the path of an existing file that is not a
	// namespace.
	NotNamespace(t *testing.T) string
	// HostNamespace returns a path to the node's own namespace.
	HostNamespace(t *testing.T) string
	// EditRule edits one rule of rs's table in place, keeping rs's
	// comment.
	EditRule(t *testing.T, path string, rs *nft.Ruleset)
	// AddForeignRule adds a rule without our comment to rs's table.
	AddForeignRule(t *testing.T, path string, rs *nft.Ruleset)
	// DeleteTable deletes our table.
	DeleteTable(t *testing.T, path string)
	// DeleteRule deletes r's fwmark rule of family.
	DeleteRule(t *testing.T, path string, r netns.Routing, family int)
	// Dump describes the namespace's table and routing; equal dumps mean
	// nothing changed.
	Dump(t *testing.T, path string) string
	// SetTakeOver makes Engine take over foreign capture (or not).
	SetTakeOver(t *testing.T, on bool)
	// AddForeignCapture installs istio-cni's in-pod rules (iptables-nft,
	// both families; see IstioInpodRules).
	AddForeignCapture(t *testing.T, path string)
	// AddLegacyCapture adds LegacyRule as a legacy iptables rule.
	AddLegacyCapture(t *testing.T, path string)
	// AddRouting installs r's rules and routes as another agent would
	// (istio-cni's policy routing is byte-equal to ours by default).
	AddRouting(t *testing.T, path string, r netns.Routing)
}

// Run runs the contract cases, each on a fresh Env from newEnv.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newEnv(t))
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, e Env)
}{
	{"ApplyIsInSync", testApplyIsInSync},
	{"ApplyTwiceChangesNothing", testApplyTwice},
	{"ApplyInvalidRoutingChangesNothing", testApplyInvalidRouting},
	{"AnotherSpecDrifts", testAnotherSpecDrifts},
	{"RemoveLeavesNothing", testRemove},
	{"RemoveOfNothingSucceeds", testRemoveNothing},
	{"RemoveRoutingAlone", testRemoveRouting},
	{"Reroute", testReroute},
	{"EditedRuleDrifts", testEditedRule},
	{"ForeignRuleDriftsAndHasNoOwner", testForeignRule},
	{"DeletedTableIsAbsent", testDeletedTable},
	{"DeletedRuleLeavesRoutingIncomplete", testDeletedRule},
	{"OpenRefusals", testOpenRefusals},
	{"OpenAfterDelete", testOpenAfterDelete},
	{"OpenNamespaceOutlivesItsPath", testOutlivesPath},
	{"ReplacedNamespaceIsAnother", testReplaced},
	{"ClosedNamespaceIsRefused", testClosed},
	{"CandidatesListNamespaces", testCandidates},
	{"ForeignCaptureRefused", testForeignCaptureRefused},
	{"ForeignCaptureTakenOver", testForeignCaptureTakenOver},
	{"LegacyCaptureRefused", testLegacyCaptureRefused},
	{"ForeignCaptureAfterApplyIsSeen", testForeignCaptureAfterApply},
	{"UndoOfApplyLeavesNothing", testUndoLeavesNothing},
	{"UndoKeepsRoutingThatWasThere", testUndoKeepsRouting},
	{"RefusalBesideForeignRoutingReportsNoChange", testRefusalBesideRouting},
}

const (
	podA = "c0a7e5d1-contract-a"
	podB = "c0a7e5d1-contract-b"
)

func ruleset(t *testing.T, pod string, excludeInbound ...uint16) *nft.Ruleset {
	t.Helper()
	s := nft.DefaultSpec(pod)
	s.ExcludeInboundPorts = excludeInbound
	rs, err := nft.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func open(t *testing.T, e Env, path string) capture.Namespace {
	t.Helper()
	ns, err := e.Engine().Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func apply(t *testing.T, e Env, ns capture.Namespace, rs *nft.Ruleset, r netns.Routing) {
	t.Helper()
	if _, err := ns.Apply(context.Background(), rs, r); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

func inspect(t *testing.T, e Env, ns capture.Namespace, rs *nft.Ruleset, r netns.Routing) capture.Live {
	t.Helper()
	l, err := ns.Inspect(context.Background(), rs, r)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return l
}

func wantOwner(t *testing.T, e Env, ns capture.Namespace, pod string, exists bool) {
	t.Helper()
	got, ok, err := ns.Owner(context.Background())
	if err != nil || got != pod || ok != exists {
		t.Errorf("Owner = %q, %t, %v; want %q, %t", got, ok, err, pod, exists)
	}
}

func wantTable(t *testing.T, l capture.Live, st nft.Status) {
	t.Helper()
	if l.Table != st {
		t.Errorf("table is %v, want %v\n%s", l.Table, st, l.Text)
	}
}

// fresh makes a namespace, opens it and applies rs with r.
func fresh(t *testing.T, e Env, rs *nft.Ruleset, r netns.Routing) (string, capture.Namespace) {
	t.Helper()
	path := e.NewNamespace(t)
	ns := open(t, e, path)
	apply(t, e, ns, rs, r)
	return path, ns
}

func testApplyIsInSync(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	_, ns := fresh(t, e, rs, r)
	l := inspect(t, e, ns, rs, r)
	if !l.InSync() {
		t.Errorf("after Apply: table %v, routing %+v; want in sync", l.Table, l.Routing)
	}
	if !l.Routing.V6Capable || !l.Routing.V6Rule || !l.Routing.V6Route {
		t.Errorf("routing %+v: want IPv6 set up too in a namespace with ::1", l.Routing)
	}
	if l.Text != rs.String() {
		t.Errorf("in-sync text is not the ruleset's rendering\n--- got\n%s\n--- want\n%s", l.Text, rs.String())
	}
	wantOwner(t, e, ns, podA, true)
}

func testApplyTwice(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path, ns := fresh(t, e, rs, r)
	before := e.Dump(t, path)
	apply(t, e, ns, rs, r)
	if after := e.Dump(t, path); after != before {
		t.Errorf("second Apply changed the namespace\n--- before\n%s\n--- after\n%s", before, after)
	}
	if l := inspect(t, e, ns, rs, r); !l.InSync() {
		t.Errorf("after two Applies: %v, %+v", l.Table, l.Routing)
	}
}

func testApplyInvalidRouting(t *testing.T, e Env) {
	path := e.NewNamespace(t)
	ns := open(t, e, path)
	before := e.Dump(t, path)
	bad := netns.DefaultRouting()
	bad.Mask = 0
	c, err := ns.Apply(context.Background(), ruleset(t, podA), bad)
	if err == nil {
		t.Fatal("Apply with a zero mark mask succeeded")
	}
	if !c.Routing.Empty() || c.Table {
		t.Errorf("refused Apply reports a change: %+v", c)
	}
	if after := e.Dump(t, path); after != before {
		t.Errorf("refused Apply changed the namespace\n--- before\n%s\n--- after\n%s", before, after)
	}
}

func testAnotherSpecDrifts(t *testing.T, e Env) {
	a, b, r := ruleset(t, podA), ruleset(t, podA, 8080), netns.DefaultRouting()
	_, ns := fresh(t, e, a, r)
	l := inspect(t, e, ns, b, r)
	wantTable(t, l, nft.StatusDrifted)
	if !strings.Contains(l.Text, "# drift: ") {
		t.Errorf("drifted text has no drift line:\n%s", l.Text)
	}
	if !l.Routing.Complete() || l.InSync() {
		t.Errorf("routing %+v complete and InSync %t; want complete routing and not in sync", l.Routing, l.InSync())
	}
	apply(t, e, ns, b, r)
	wantTable(t, inspect(t, e, ns, b, r), nft.StatusInSync)
	wantTable(t, inspect(t, e, ns, a, r), nft.StatusDrifted)
	// Another pod's ruleset replaces the table, owner and all.
	c := ruleset(t, podB)
	apply(t, e, ns, c, r)
	wantTable(t, inspect(t, e, ns, c, r), nft.StatusInSync)
	wantOwner(t, e, ns, podB, true)
}

func testRemove(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	_, ns := fresh(t, e, rs, r)
	if err := ns.Remove(context.Background(), r); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	l := inspect(t, e, ns, rs, r)
	wantTable(t, l, nft.StatusAbsent)
	if l.Text != "" {
		t.Errorf("absent table has text %q", l.Text)
	}
	if !l.Routing.Absent() {
		t.Errorf("routing after Remove: %+v; want none", l.Routing)
	}
	wantOwner(t, e, ns, "", false)
}

func testRemoveNothing(t *testing.T, e Env) {
	path := e.NewNamespace(t)
	ns := open(t, e, path)
	before := e.Dump(t, path)
	r := netns.DefaultRouting()
	if err := ns.Remove(context.Background(), r); err != nil {
		t.Errorf("Remove of nothing: %v", err)
	}
	if err := ns.RemoveRouting(context.Background(), r); err != nil {
		t.Errorf("RemoveRouting of nothing: %v", err)
	}
	if after := e.Dump(t, path); after != before {
		t.Errorf("removing nothing changed the namespace\n--- before\n%s\n--- after\n%s", before, after)
	}
	wantOwner(t, e, ns, "", false)
}

func testRemoveRouting(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	_, ns := fresh(t, e, rs, r)
	if err := ns.RemoveRouting(context.Background(), r); err != nil {
		t.Fatalf("RemoveRouting: %v", err)
	}
	l := inspect(t, e, ns, rs, r)
	wantTable(t, l, nft.StatusInSync)
	if !l.Routing.Absent() {
		t.Errorf("routing after RemoveRouting: %+v; want none", l.Routing)
	}
}

func testReroute(t *testing.T, e Env) {
	rs, old := ruleset(t, podA), netns.DefaultRouting()
	moved := netns.Routing{Mark: 0x222, Mask: 0xfff, Table: 101, Priority: 32000}
	// Same table, another priority: the old route must survive the move.
	shared := old
	shared.Priority = 32001
	_, ns := fresh(t, e, rs, old)
	for _, step := range []struct {
		name     string
		from, to netns.Routing
	}{{"to another table", old, moved}, {"back", moved, old}, {"to a shared table", old, shared}} {
		if err := ns.Reroute(context.Background(), step.from, step.to); err != nil {
			t.Fatalf("Reroute %s: %v", step.name, err)
		}
		if l := inspect(t, e, ns, rs, step.to); !l.InSync() {
			t.Errorf("Reroute %s: new routing %+v, table %v; want in sync", step.name, l.Routing, l.Table)
		}
		l := inspect(t, e, ns, rs, step.from)
		if l.Routing.V4Rule || l.Routing.V6Rule {
			t.Errorf("Reroute %s: old rules remain: %+v", step.name, l.Routing)
		}
	}
}

func testEditedRule(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path, ns := fresh(t, e, rs, r)
	e.EditRule(t, path, rs)
	l := inspect(t, e, ns, rs, r)
	wantTable(t, l, nft.StatusDrifted)
	if !strings.Contains(l.Text, "# drift: ") {
		t.Errorf("drifted text has no drift line:\n%s", l.Text)
	}
	wantOwner(t, e, ns, podA, true)
	apply(t, e, ns, rs, r)
	wantTable(t, inspect(t, e, ns, rs, r), nft.StatusInSync)
}

func testForeignRule(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path, ns := fresh(t, e, rs, r)
	e.AddForeignRule(t, path, rs)
	wantTable(t, inspect(t, e, ns, rs, r), nft.StatusDrifted)
	wantOwner(t, e, ns, "", true)
	apply(t, e, ns, rs, r)
	wantTable(t, inspect(t, e, ns, rs, r), nft.StatusInSync)
	wantOwner(t, e, ns, podA, true)
}

func testDeletedTable(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path, ns := fresh(t, e, rs, r)
	e.DeleteTable(t, path)
	l := inspect(t, e, ns, rs, r)
	wantTable(t, l, nft.StatusAbsent)
	if !l.Routing.Complete() {
		t.Errorf("routing %+v: deleting the table must leave it", l.Routing)
	}
	wantOwner(t, e, ns, "", false)
	if err := ns.Remove(context.Background(), r); err != nil {
		t.Errorf("Remove without a table: %v", err)
	}
	if l := inspect(t, e, ns, rs, r); !l.Routing.Absent() {
		t.Errorf("Remove without a table left routing %+v", l.Routing)
	}
}

func testDeletedRule(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		path, ns := fresh(t, e, rs, r)
		e.DeleteRule(t, path, r, fam)
		l := inspect(t, e, ns, rs, r)
		if l.Routing.Complete() || l.InSync() {
			t.Errorf("family %d: rule deleted, yet routing %+v is complete", fam, l.Routing)
		}
		if got := map[int]bool{unix.AF_INET: l.Routing.V4Rule, unix.AF_INET6: l.Routing.V6Rule}[fam]; got {
			t.Errorf("family %d: deleted rule still reported: %+v", fam, l.Routing)
		}
		wantTable(t, l, nft.StatusInSync)
		apply(t, e, ns, rs, r)
		if l := inspect(t, e, ns, rs, r); !l.InSync() {
			t.Errorf("family %d: Apply did not restore the rule: %+v", fam, l.Routing)
		}
	}
}

func wantOpenError(t *testing.T, e Env, path string, want error) {
	t.Helper()
	ns, err := e.Engine().Open(path)
	if err == nil {
		ns.Close()
	}
	if !errors.Is(err, want) {
		t.Errorf("Open(%q) = %v; want %v", path, err, want)
	}
}

func testOpenRefusals(t *testing.T, e Env) {
	wantOpenError(t, e, filepath.Join(filepath.Dir(e.NewNamespace(t)), "nftr-never-created"), netns.ErrNotExist)
	wantOpenError(t, e, e.NotNamespace(t), netns.ErrNotNetns)
	wantOpenError(t, e, e.HostNamespace(t), netns.ErrHostNetns)
	wantOpenError(t, e, "run/netns/relative", netns.ErrNotAbsolute)
}

func testOpenAfterDelete(t *testing.T, e Env) {
	path := e.NewNamespace(t)
	e.DeleteNamespace(t, path)
	wantOpenError(t, e, path, netns.ErrNotExist)
}

// A namespace stays programmable through an open Namespace after its
// path is gone, as an open fd keeps a kernel namespace alive.
func testOutlivesPath(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path := e.NewNamespace(t)
	ns := open(t, e, path)
	e.DeleteNamespace(t, path)
	apply(t, e, ns, rs, r)
	if l := inspect(t, e, ns, rs, r); !l.InSync() {
		t.Errorf("after Apply on a namespace whose path is gone: %v, %+v", l.Table, l.Routing)
	}
	if err := ns.Remove(context.Background(), r); err != nil {
		t.Errorf("Remove: %v", err)
	}
}

func testReplaced(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path, ns := fresh(t, e, rs, r)
	old := ns.ID()
	ns.Close()
	e.ReplaceNamespace(t, path)
	again := open(t, e, path)
	if id := again.ID(); id == old || id.IsZero() {
		t.Errorf("replaced namespace has ID %s, the old one had %s; want another", id, old)
	}
	if again.Path() != path {
		t.Errorf("Path = %q, want %q", again.Path(), path)
	}
	l := inspect(t, e, again, rs, r)
	wantTable(t, l, nft.StatusAbsent)
	if !l.Routing.Absent() {
		t.Errorf("replaced namespace has routing %+v", l.Routing)
	}
}

// The descriptor is open until Close and names the namespace (fstat
// gives the ID's dev:ino), and a closed Namespace is refused rather than
// worked on in some other namespace.
func testClosed(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path := e.NewNamespace(t)
	ns := open(t, e, path)
	fd := ns.Fd()
	id, err := FileID(fd)
	if err != nil {
		t.Fatalf("Fd %d of an open namespace: %v", fd, err)
	}
	if !id.SameFile(ns.ID()) {
		t.Errorf("Fd names %s, the namespace is %s", id, ns.ID())
	}
	if err := ns.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := ns.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	ctx := context.Background()
	if _, err := ns.Inspect(ctx, rs, r); err == nil {
		t.Error("Inspect of a closed namespace succeeded")
	}
	if _, _, err := ns.Owner(ctx); err == nil {
		t.Error("Owner of a closed namespace succeeded")
	}
}

func testCandidates(t *testing.T, e Env) {
	path := e.NewNamespace(t)
	if c := e.Engine().Candidates(); !slices.Contains(c, path) {
		t.Errorf("Candidates lacks %s (%d listed)", path, len(c))
	}
	e.DeleteNamespace(t, path)
	if c := e.Engine().Candidates(); slices.Contains(c, path) {
		t.Errorf("Candidates still lists deleted %s", path)
	}
}

// wantRefused requires Apply to refuse the namespace at path with
// ErrForeignCapture naming what, and to change nothing.
func wantRefused(t *testing.T, e Env, path string, what string) {
	t.Helper()
	ns := open(t, e, path)
	before := e.Dump(t, path)
	c, err := ns.Apply(context.Background(), ruleset(t, podA), netns.DefaultRouting())
	if !errors.Is(err, capture.ErrForeignCapture) {
		t.Fatalf("Apply = %v; want %v", err, capture.ErrForeignCapture)
	}
	if !c.Routing.Empty() || c.Table {
		t.Errorf("refused Apply reports a change: %+v", c)
	}
	if !strings.Contains(err.Error(), what) {
		t.Errorf("refusal %q does not name %q", err, what)
	}
	if after := e.Dump(t, path); after != before {
		t.Errorf("refused Apply changed the namespace\n--- before\n%s\n--- after\n%s", before, after)
	}
}

func testForeignCaptureRefused(t *testing.T, e Env) {
	path := e.NewNamespace(t)
	e.AddForeignCapture(t, path)
	wantRefused(t, e, path, "ISTIO_OUTPUT")
}

func testForeignCaptureTakenOver(t *testing.T, e Env) {
	e.SetTakeOver(t, true)
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path := e.NewNamespace(t)
	e.AddForeignCapture(t, path)
	if before := e.Dump(t, path); !strings.Contains(before, "ISTIO_PRERT") {
		t.Fatalf("no foreign capture to take over:\n%s", before)
	}
	ns := open(t, e, path)
	apply(t, e, ns, rs, r)
	after := e.Dump(t, path)
	t.Logf("after take-over:\n%s", after)
	if strings.Contains(after, "ISTIO_") {
		t.Errorf("foreign chains left after take-over:\n%s", after)
	}
	if l := inspect(t, e, ns, rs, r); !l.InSync() {
		t.Errorf("after take-over: table %v, routing %+v; want in sync", l.Table, l.Routing)
	}
	wantOwner(t, e, ns, podA, true)
	// Done: a second Apply has nothing to take over and changes nothing.
	apply(t, e, ns, rs, r)
	if again := e.Dump(t, path); again != after {
		t.Errorf("Apply after take-over changed the namespace\n--- before\n%s\n--- after\n%s", after, again)
	}
}

func testLegacyCaptureRefused(t *testing.T, e Env) {
	for _, on := range []bool{false, true} {
		e.SetTakeOver(t, on)
		path := e.NewNamespace(t)
		e.AddLegacyCapture(t, path)
		wantRefused(t, e, path, "iptables table nat")
	}
}

// Capture another agent adds beside ours makes the namespace out of sync,
// naming it, and the next Apply takes it over.
func testForeignCaptureAfterApply(t *testing.T, e Env) {
	e.SetTakeOver(t, true)
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path := e.NewNamespace(t)
	apply(t, e, open(t, e, path), rs, r)
	e.AddForeignCapture(t, path)
	ns := open(t, e, path)
	l := inspect(t, e, ns, rs, r)
	if l.InSync() || !strings.Contains(l.Foreign, "ISTIO_PRERT") {
		t.Errorf("with istio-cni's rules beside ours: InSync %t, Foreign %q; want out of sync, naming them", l.InSync(), l.Foreign)
	}
	wantTable(t, l, nft.StatusInSync)
	apply(t, e, ns, rs, r)
	if l := inspect(t, e, ns, rs, r); !l.InSync() || l.Foreign != "" {
		t.Errorf("after Apply: InSync %t, Foreign %q", l.InSync(), l.Foreign)
	}
}

// Apply in an empty namespace reports every entry it created; Undo of
// that Change leaves the namespace as it was.
func testUndoLeavesNothing(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path := e.NewNamespace(t)
	ns := open(t, e, path)
	before := e.Dump(t, path)
	c, err := ns.Apply(context.Background(), rs, r)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	want := netns.Added{Routing: r, V4Rule: true, V4Route: true, V6Rule: true, V6Route: true}
	if !c.Table || c.TookOver || c.Routing != want {
		t.Errorf("Change = %+v; want the table and %+v", c, want)
	}
	if err := ns.Undo(context.Background(), c); err != nil {
		t.Fatalf("Undo: %v", err)
	}
	if after := e.Dump(t, path); after != before {
		t.Errorf("Undo left the namespace changed\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// Policy routing byte-equal to ours that was there before the Apply is
// not the Apply's: its Change does not list it, and its Undo leaves it.
func testUndoKeepsRouting(t *testing.T, e Env) {
	rs, r := ruleset(t, podA), netns.DefaultRouting()
	path := e.NewNamespace(t)
	e.AddRouting(t, path, r)
	ns := open(t, e, path)
	before := e.Dump(t, path)
	c, err := ns.Apply(context.Background(), rs, r)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if !c.Routing.Empty() || !c.Table {
		t.Errorf("Change = %+v; want the table alone", c)
	}
	if err := ns.Undo(context.Background(), c); err != nil {
		t.Fatalf("Undo: %v", err)
	}
	if after := e.Dump(t, path); after != before {
		t.Errorf("Undo changed what was there before the Apply\n--- before\n%s\n--- after\n%s", before, after)
	}
	if l := inspect(t, e, ns, rs, r); !l.Routing.Complete() {
		t.Errorf("the earlier routing is gone: %+v", l.Routing)
	}
}

// A refused Apply beside another agent's capture and its policy routing
// reports no change, and an Undo of what it reports keeps that routing.
func testRefusalBesideRouting(t *testing.T, e Env) {
	r := netns.DefaultRouting()
	path := e.NewNamespace(t)
	e.AddRouting(t, path, r)
	e.AddForeignCapture(t, path)
	ns := open(t, e, path)
	before := e.Dump(t, path)
	c, err := ns.Apply(context.Background(), ruleset(t, podA), r)
	if !errors.Is(err, capture.ErrForeignCapture) {
		t.Fatalf("Apply = %v; want %v", err, capture.ErrForeignCapture)
	}
	if err := ns.Undo(context.Background(), c); err != nil {
		t.Fatalf("Undo: %v", err)
	}
	if after := e.Dump(t, path); after != before {
		t.Errorf("refused Apply and its Undo changed the namespace\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// fakeEnv drives a Fake through its hooks.
type fakeEnv struct {
	f    *Fake
	next int
	dir  string
}

// NewFakeEnv returns an Env over a new Fake, with namespaces under
// /run/netns as on a node.
func NewFakeEnv(t *testing.T) Env { return NewFakeEnvOf(t, NewFake()) }

// NewFakeEnvOf returns an Env over f, so a test can use both.
func NewFakeEnvOf(_ *testing.T, f *Fake) Env { return &fakeEnv{f: f, dir: "/run/netns"} }

func (e *fakeEnv) Engine() capture.Engine { return e.f }

func (e *fakeEnv) NewNamespace(t *testing.T) string {
	e.next++
	path := filepath.Join(e.dir, "fake-"+strings.ReplaceAll(t.Name(), "/", "_")+"-"+strconv.Itoa(e.next))
	e.f.AddNamespace(path)
	return path
}

func (e *fakeEnv) DeleteNamespace(_ *testing.T, path string)  { e.f.DeleteNamespace(path) }
func (e *fakeEnv) ReplaceNamespace(_ *testing.T, path string) { e.f.ReplaceNamespace(path) }
func (e *fakeEnv) NotNamespace(_ *testing.T) string {
	path := filepath.Join(e.dir, "not-a-namespace")
	e.f.AddFile(path)
	return path
}
func (e *fakeEnv) HostNamespace(_ *testing.T) string                  { return HostPaths[0] }
func (e *fakeEnv) EditRule(_ *testing.T, path string, _ *nft.Ruleset) { e.f.EditRule(path) }
func (e *fakeEnv) AddForeignRule(_ *testing.T, path string, _ *nft.Ruleset) {
	e.f.AddForeignRule(path)
}
func (e *fakeEnv) DeleteTable(_ *testing.T, path string) { e.f.DeleteTable(path) }
func (e *fakeEnv) DeleteRule(_ *testing.T, path string, r netns.Routing, family int) {
	e.f.DeleteRule(path, r, family)
}
func (e *fakeEnv) Dump(_ *testing.T, path string) string { return e.f.Dump(path) }
func (e *fakeEnv) SetTakeOver(_ *testing.T, on bool)     { e.f.SetTakeOver(on) }
func (e *fakeEnv) AddForeignCapture(_ *testing.T, path string) {
	e.f.AddForeignCapture(path, IstioForeign(true))
}
func (e *fakeEnv) AddRouting(_ *testing.T, path string, r netns.Routing) {
	e.f.AddRouting(path, r)
}
func (e *fakeEnv) AddLegacyCapture(_ *testing.T, path string) {
	e.f.AddForeignCapture(path, &nft.Foreign{Legacy: []netns.XTable{{Family: "ip", Name: "nat", Entries: 1}}})
}
