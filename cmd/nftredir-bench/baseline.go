package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A/B against an earlier build (-baseline-daemon): a second nftredird,
// from another binary, measured with the same AddPod and RemovePod
// samples in the same rotation as this build's, so that a refactor's
// effect on the daemon's speed is read from one run on one machine.

// baselineInfo is what the report says about the earlier build.
type baselineInfo struct {
	bin     string
	version string // its --version, or why there is none
	// rules and thisRules are the rule counts of the two builds' tables,
	// as verified in the pods they programmed.
	rules, thisRules int
}

// The baseline build's method names: this build's, marked, so that
// rpcName (and the daemon log's RPC it picks) still works on them.
func mAddBase(conc int) string    { return mAdd(conc) + ", baseline build" }
func mRemoveBase(conc int) string { return mRemove(conc) + ", baseline build" }

// baselineDaemon is the earlier build's running daemon and the node
// namespace that is its alone: each daemon keeps its probe table and pod
// address sets in its node namespace, and two sharing one would rewrite
// each other's.
type baselineDaemon struct {
	d    *daemon
	node string
}

func (b *bench) startBaseline(ctx context.Context) (*baselineDaemon, error) {
	node, err := b.pool.create(1, "basenode")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.work, "baseline")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	d, err := b.startDaemonOf(b.cfg.baselineDaemon, dir, nsPath(node[0]))
	if err != nil {
		return nil, fmt.Errorf("baseline daemon: %w", err)
	}
	if _, err := d.waitServing(ctx, time.Minute); err != nil {
		return nil, fmt.Errorf("baseline daemon: %w", err)
	}
	return &baselineDaemon{d: d, node: node[0]}, nil
}

// stopBaseline stops the earlier build's daemon once its section is done,
// so that it sits idle beside none of the later sections.
func (b *bench) stopBaseline(base *baselineDaemon) error {
	return errors.Join(b.stopDaemon(base.d), b.pool.remove([]string{base.node}))
}

// daemonVersion is a binary's --version, on one line. A build from before
// the flag existed exits with a usage error, which is reported as such
// rather than failing the run: the path still identifies it.
func daemonVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
		return fmt.Sprintf("no --version (%v: %s)", err, first)
	}
	return strings.Join(strings.Fields(out.String()), " ")
}
