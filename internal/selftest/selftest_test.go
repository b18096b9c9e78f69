package selftest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/internal/nstest"
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
	for _, want := range []string{"tproxy", "socket", "redirect", "conntrack (ct state, ct mark)", "nat chains", "policy routing", "pod table (TPROXY mode)", "pod table (REDIRECT mode)", "node probe table (sets, snat, meta skuid)"} {
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
