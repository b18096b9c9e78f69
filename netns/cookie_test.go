package netns

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestOpenReadsCookieWithoutEntering: where the kernel's NS_GET_ID is
// the namespace's cookie, Open identifies a namespace without entering
// it, and the handle enters on its first use (once, for every socket and
// the legacy tables); where it is not, Open enters to read the cookie
// and makes everything in that one visit. Both ways give the same ID,
// the cookie a socket made inside the namespace carries, so records
// written one way match namespaces opened the other.
func TestOpenReadsCookieWithoutEntering(t *testing.T) {
	nstest.RequirePrivileged(t)
	ns := nstest.NewNetns(t)
	var inside uint64
	if err := ns.Do(func() error {
		var err error
		inside, err = cookieHere()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	g, err := NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("uname", "-r").Output()
	t.Logf("kernel %s: NS_GET_ID is the cookie: %v", strings.TrimSpace(string(out)), g.cookieByID)
	for _, byID := range []bool{true, false} {
		if byID && !g.cookieByID {
			continue // a kernel before 6.18, or one whose counters differ
		}
		g.cookieByID = byID
		h, err := g.Open(ns.Path)
		if err != nil {
			t.Fatal(err)
		}
		if h.ID().Cookie != inside || inside == 0 {
			t.Errorf("cookie by NS_GET_ID %v: ID %s, want the cookie %d a socket inside the namespace has", byID, h.ID(), inside)
		}
		if h.c.visited == byID {
			t.Errorf("cookie by NS_GET_ID %v: entered the namespace at Open: %v", byID, h.c.visited)
		}
		addrs, err := InterfaceAddrs(h)
		if err != nil {
			t.Fatalf("cookie by NS_GET_ID %v: the handle's first use: %v", byID, err)
		}
		if _, err := LegacyTables(h); err != nil || !h.c.visited || h.c.route == nil || h.c.tables == nil || h.c.reader == nil {
			t.Errorf("cookie by NS_GET_ID %v: after first use visited %v, connections %v %v %v, legacy tables %v", byID, h.c.visited, h.c.route, h.c.tables, h.c.reader, err)
		}
		t.Logf("cookie by NS_GET_ID %v: %s, addresses %v", byID, h.ID(), addrs)
		h.Close()
	}
}

// TestLegacyTablesOfAnUnusedHandle: a handle asked for its legacy tables
// before any other use enters the namespace to read them.
func TestLegacyTablesOfAnUnusedHandle(t *testing.T) {
	nstest.RequirePrivileged(t)
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Skip("no iptables-legacy on this machine")
	}
	ns := nstest.NewNetns(t)
	ns.Run(t, "iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", "REDIRECT", "--to-ports", "15001")
	g, err := NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	got, err := LegacyTables(h)
	if err != nil || len(got) != 1 || got[0].Name != "nat" {
		t.Fatalf("LegacyTables = %v, %v; want the nat table", got, err)
	}
}
