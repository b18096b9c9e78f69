package nft_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftredir/nftredir/nft"
)

// countedLo matches the outbound loopback rule with a non-zero count.
var countedLo = regexp.MustCompile(`oifname "lo" counter packets ([1-9][0-9]*) bytes [1-9][0-9]* accept`)

// TestCountersCountAndAreNotDrift: every rule carries a counter; traffic
// moves it, and Verify (the drift check) and Apply take the table with
// moved counters as in sync (Apply sends nothing, so the counts stay),
// while a rule that lost its counter is drift that Apply repairs. The
// live text shows the kernel's counts, as nft does.
func TestCountersCountAndAreNotDrift(t *testing.T) {
	requireRoot(t)
	n, h := scratchNetns(t)
	rs, err := nft.Build(nft.DefaultSpec("0b6f3c1e-pod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if !strings.Contains(r.Text, " counter packets 0 bytes 0 ") {
				t.Errorf("chain %s rule %q has no counter before its statement", c.Name, r.Text)
			}
		}
	}
	a := nft.NewNetlink()
	ctx := context.Background()
	if err := a.Apply(ctx, h, rs); err != nil {
		t.Fatal(err)
	}
	// A connection attempt inside the pod to a closed loopback port: its
	// SYN passes nat-output's loopback accept; the RST answers it.
	if err := n.Do(func() error {
		c, err := net.DialTimeout("tcp4", "127.0.0.1:9", time.Second)
		if err == nil {
			c.Close()
			return errors.New("something listens on 127.0.0.1:9 in a fresh namespace")
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	listed := n.Nft(t, "list", "table", "inet", nft.TableName)
	m := countedLo.FindStringSubmatch(listed)
	if m == nil {
		t.Fatalf("nft does not show the loopback rule counting the SYN:\n%s", listed)
	}
	st, text, err := a.Verify(ctx, h, rs)
	if err != nil || st != nft.StatusInSync {
		t.Fatalf("Verify with moved counters = %s, %v; want in sync\n%s", st, err, text)
	}
	if text != listed {
		t.Errorf("Verify's text differs from nft's listing\n--- Verify\n%s\n--- nft\n%s", text, listed)
	}
	// In sync: Apply sends nothing, so the counts survive a reconcile.
	if err := a.Apply(ctx, h, rs); err != nil {
		t.Fatal(err)
	}
	if after := countedLo.FindStringSubmatch(n.Nft(t, "list", "table", "inet", nft.TableName)); after == nil || after[1] != m[1] {
		t.Errorf("Apply of an in-sync table reset the counters: %q before, %q after", m, after)
	}

	// The same rule without its counter: same words, same comment.
	handle, _ := ruleHandle(t, n, "nat-output", `oifname "lo"`)
	n.Nft(t, "replace", "rule", "inet", nft.TableName, "nat-output", "handle", handle,
		"oifname", "lo", "accept", "comment", fmt.Sprintf("%q", rs.Comment()))
	st, text, err = a.Verify(ctx, h, rs)
	if err != nil || st != nft.StatusDrifted {
		t.Fatalf("Verify with a rule's counter gone = %s, %v; want drifted\n%s", st, err, text)
	}
	if !strings.Contains(text, "\t\toifname \"lo\" accept comment") || !strings.Contains(text, "# drift: chain nat-output rule") {
		t.Errorf("Verify's text does not show the rule without its counter as drift:\n%s", text)
	}
	if err := a.Apply(ctx, h, rs); err != nil {
		t.Fatal(err)
	}
	if st, text, err := a.Verify(ctx, h, rs); err != nil || st != nft.StatusInSync {
		t.Errorf("Verify after re-Apply = %s, %v; want in sync\n%s", st, err, text)
	}
}
