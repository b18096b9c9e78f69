package selftest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/nft"
)

// TestPassesHere runs the real checks against this machine's kernel, which
// the rest of the test suite needs to have every feature.
func TestPassesHere(t *testing.T) {
	nstest.RequirePrivileged(t)
	checks, err := Checks(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results, err := Run(ctx, checks)
	for _, r := range results {
		t.Logf("%-45s %v %s", r.Name, r.Err, r.Duration)
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range results {
		names = append(names, r.Name)
	}
	// The features the issue names must each have been checked on their
	// own, not only inside a whole ruleset.
	for _, want := range []string{"tproxy", "socket", "redirect", "conntrack (ct state, ct mark)", "nat chains", "policy routing", "pod table (TPROXY mode)", "pod table (REDIRECT mode)", "node probe table (sets, snat, meta skuid)", "TPROXY source validation"} {
		if !strings.Contains("\n"+strings.Join(names, "\n")+"\n", "\n"+want+"\n") {
			t.Errorf("no check %q among %q", want, names)
		}
	}
}

// TestMissingFeatureIsNamed asks the kernel for a chain type it has no
// module for, the same request_module path that fails for a missing
// nft_chain_nat, and checks the failure names the module and does not
// stop the other checks.
func TestMissingFeatureIsNamed(t *testing.T) {
	nstest.RequirePrivileged(t)
	checks, err := Checks(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	bogus := chainCheck("bogus chains", []string{"nft_chain_bogus"}, nftables.ChainType("nftredir-bogus"))
	checks = append([]Check{checks[0], bogus}, checks[1:]...)
	results, err := Run(context.Background(), checks)
	var serr *Error
	if !errors.As(err, &serr) {
		t.Fatalf("Run: %v, want an *Error", err)
	}
	if len(serr.Failed) != 1 || serr.Failed[0].Name != "bogus chains" {
		t.Fatalf("failed checks %+v, want only the bogus one", serr.Failed)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"kernel self-test failed", "bogus chains", "needs kernel module nft_chain_bogus", "modprobe nft_chain_bogus", "no such file or directory"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if len(results) != len(checks) {
		t.Errorf("%d results for %d checks: a failure stopped the rest", len(results), len(checks))
	}
}

func TestChecksCoverTheRulesetsExpressions(t *testing.T) {
	checks, err := Checks(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if len(checks) < 10 {
		t.Fatalf("only %d checks", len(checks))
	}
	// Without a probe spec there is no node table check.
	cfg := DefaultConfig()
	cfg.Probe = nil
	noProbe, err := Checks(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(noProbe) != len(checks)-1 {
		t.Errorf("%d checks without the probe table, %d with", len(noProbe), len(checks))
	}
	bad := DefaultConfig()
	bad.Spec.OutboundPort = 0
	if _, err := Checks(bad); err == nil {
		t.Error("an invalid spec built checks")
	}
}

// TestSrcValidMarkRefusesTProxy: where new namespaces get src_valid_mark=1
// (e2e TestSrcValidMark shows TPROXY dropping every inbound connection
// then), the check fails naming the sysctl and the way out; it is not run
// when REDIRECT is the default mode. The kernel side cannot be staged
// here: new namespaces copy the machine's own value, which tests never
// change.
func TestSrcValidMarkRefusesTProxy(t *testing.T) {
	c := srcValidMarkCheck()
	err := c.run(context.Background(), &scratch{srcValidMark: []string{"net.ipv4.conf.all.src_valid_mark"}})
	if err == nil || !strings.Contains(err.Error(), "net.ipv4.conf.all.src_valid_mark is 1") {
		t.Errorf("check with src_valid_mark set: %v; want it named", err)
	}
	e := &Error{Failed: []Result{{Name: c.Name, Remedy: c.Remedy, Err: err}}}
	if !strings.Contains(e.Error(), "--capture-mode redirect") {
		t.Errorf("failure %q does not say how to run on this node", e.Error())
	}
	if err := c.run(context.Background(), &scratch{}); err != nil {
		t.Errorf("check without src_valid_mark: %v", err)
	}
	cfg := DefaultConfig()
	cfg.Spec.Mode = nft.ModeRedirect
	checks, err := Checks(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.Name == "TPROXY source validation" {
			t.Error("checked for TPROXY with REDIRECT the default mode")
		}
	}
}
