package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/nft"
)

// scaleResult is the reconcile-at-scale phase: one daemon over R recorded
// pods, restarted with everything in sync and with every table deleted.
type scaleResult struct {
	pods       int
	emptyStart time.Duration // start→SERVING with no records
	enrol      *sample       // the R AddPods that created the records
	rss0, rssN int64         // after start with no pods; after R AddPods
	// anon0, anonN, anonRestart: RssAnon at the same readings.
	anon0, anonN, anonRestart int64
	fds0, fdsN                int
	// rssRestart, fdsRestart: after a restart that reconciled R pods.
	rssRestart int64
	fdsRestart int
	inSync     []time.Duration // start→SERVING, all R in sync
	reapply    []time.Duration // start→SERVING, all R tables re-created
	loads      []float64
}

// scaleConc is how many AddPods are in flight while enrolling the R pods:
// the concurrency of the throughput target.
const scaleConc = 8

func (b *bench) reconcileScale(ctx context.Context) (*scaleResult, error) {
	r := b.cfg.reconcilePods
	res := &scaleResult{pods: r}
	b.progress("reconcile at scale: creating %d namespaces", r)
	names, err := b.pool.create(r, "r")
	if err != nil {
		return nil, err
	}
	defer b.pool.remove(names)
	dir := filepath.Join(b.work, "scale")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}

	d, err := b.startDaemon(dir)
	if err != nil {
		return nil, err
	}
	if res.emptyStart, err = d.waitServing(ctx, time.Minute); err != nil {
		return nil, err
	}
	b.sleep(ctx, time.Second)
	if res.rss0, res.fds0, err = resources(d.pid()); err != nil {
		return nil, err
	}
	if res.anon0, err = rssAnon(d.pid()); err != nil {
		return nil, err
	}
	res.enrol = &sample{method: mAdd(scaleConc), conc: scaleConc, lat: make([]time.Duration, r), load: loadAvg()}
	t0 := time.Now()
	err = parallel(ctx, r, scaleConc, func(i int) error {
		start := time.Now()
		_, err := d.client.AddPod(ctx, addRequest(fmt.Sprintf("scale-%d", i), names[i], podIP(names[i])))
		res.enrol.lat[i] = time.Since(start)
		return err
	})
	res.enrol.wall = time.Since(t0)
	if err != nil {
		return nil, fmt.Errorf("enrol %d pods: %w", r, err)
	}
	b.sleep(ctx, time.Second)
	if res.rssN, res.fdsN, err = resources(d.pid()); err != nil {
		return nil, err
	}
	if res.anonN, err = rssAnon(d.pid()); err != nil {
		return nil, err
	}
	b.progress("  %d pods enrolled in %v; RSS %s → %s, fds %d → %d", r, res.enrol.wall.Round(time.Millisecond), mib(res.rss0), mib(res.rssN), res.fds0, res.fdsN)
	if err := b.stopDaemon(d); err != nil {
		return nil, err
	}

	for rep := range b.cfg.reps {
		res.loads = append(res.loads, loadAvg())
		d, err := b.startDaemon(dir)
		if err != nil {
			return nil, err
		}
		t, err := d.waitServing(ctx, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		res.inSync = append(res.inSync, t)
		pods, err := d.client.ListPods(ctx)
		if err != nil {
			return nil, err
		}
		if len(pods) != r {
			return nil, fmt.Errorf("after restart the daemon lists %d pods, want %d", len(pods), r)
		}
		if rep == 0 {
			b.sleep(ctx, time.Second)
			if res.rssRestart, res.fdsRestart, err = resources(d.pid()); err != nil {
				return nil, err
			}
			if res.anonRestart, err = rssAnon(d.pid()); err != nil {
				return nil, err
			}
		}
		if err := b.stopDaemon(d); err != nil {
			return nil, err
		}

		// Behind the daemon's back: delete every pod's table, as a
		// careless `nft flush ruleset` on the node would.
		if err := b.deleteTables(ctx, names); err != nil {
			return nil, err
		}
		b.sleep(ctx, b.cfg.settle)
		d, err = b.startDaemon(dir)
		if err != nil {
			return nil, err
		}
		t2, err := d.waitServing(ctx, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		res.reapply = append(res.reapply, t2)
		if err := b.stopDaemon(d); err != nil {
			return nil, err
		}
		if err := b.checkTables(ctx, names); err != nil {
			return nil, err
		}
		b.progress("  rep %d/%d: start→SERVING in sync %v, re-applying all %v", rep+1, b.cfg.reps, t.Round(time.Millisecond), t2.Round(time.Millisecond))
		b.sleep(ctx, b.cfg.settle)
	}
	return res, nil
}

// deleteTables deletes our table in every namespace through netlink: a
// process per namespace would take longer than what is being measured.
func (b *bench) deleteTables(ctx context.Context, names []string) error {
	return parallel(ctx, len(names), 4, func(i int) error {
		h, err := b.guard.Open(nsPath(names[i]))
		if err != nil {
			return err
		}
		defer h.Close()
		c, err := nftables.New(nftables.WithNetNSFd(h.Fd()))
		if err != nil {
			return err
		}
		c.DelTable(&nftables.Table{Name: nft.TableName, Family: nftables.TableFamilyINet})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("delete table in %s: %w", names[i], err)
		}
		return nil
	})
}

// checkTables confirms that the reconcile really re-created every table.
func (b *bench) checkTables(ctx context.Context, names []string) error {
	return parallel(ctx, len(names), 4, func(i int) error {
		h, err := b.guard.Open(nsPath(names[i]))
		if err != nil {
			return err
		}
		defer h.Close()
		n, err := countRules(h.Fd(), nftables.TableFamilyINet, nft.TableName)
		if err != nil {
			return err
		}
		if n != b.wantRules {
			return fmt.Errorf("after reconcile %s has %d rules in %s, want %d", names[i], n, nft.TableName, b.wantRules)
		}
		return nil
	})
}

func resources(pid int) (int64, int, error) {
	r, err := rss(pid)
	if err != nil {
		return 0, 0, err
	}
	f, err := openFDs(pid)
	return r, f, err
}

// ownResources is resources with RssAnon for VmRSS: the leak check's
// reading, which the page cache's share of the executable does not move.
func ownResources(pid int) (int64, int, error) {
	r, err := rssAnon(pid)
	if err != nil {
		return 0, 0, err
	}
	f, err := openFDs(pid)
	return r, f, err
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// idleSettle is how long the leak check lets the daemon idle before the
// readings it compares: the node probe manager keeps its netlink socket
// for 1 s after its last change, and netlink sockets are closed in the
// background after deletes; a reading inside that window counts them.
const idleSettle = 3 * time.Second

// cycleResult is the leak check: many add/remove cycles on a few
// namespaces, with the daemon's RSS and fds sampled along the way.
type cycleResult struct {
	cycles, pods, conc int
	wall               time.Duration
	before, after      point
	series             []point
	load               float64
}

// trend is the RSS growth from the start of the check to its end, each
// end the median of three readings, so that one reading taken just before
// a garbage collection does not decide the verdict.
func (c *cycleResult) trend() int64 {
	if len(c.series) < 6 {
		return c.after.rss - c.before.rss
	}
	med3 := func(ps []point) int64 {
		v := []int64{ps[0].rss, ps[1].rss, ps[2].rss}
		slices.Sort(v)
		return v[1]
	}
	return med3(c.series[len(c.series)-3:]) - med3(c.series[:3])
}

type point struct {
	cycles int
	rss    int64
	fds    int
}

// cycleCheck runs C AddPod+RemovePod cycles. Each worker owns its own
// namespaces, so no two calls for one pod race and every cycle does the
// full work of both calls.
func (b *bench) cycleCheck(ctx context.Context) (*cycleResult, error) {
	conc := b.cfg.cycleConc
	perWorker := max(1, b.cfg.cyclePods/conc)
	res := &cycleResult{cycles: b.cfg.cycles, pods: perWorker * conc, conc: conc, load: loadAvg()}
	names, err := b.pool.create(res.pods, "y")
	if err != nil {
		return nil, err
	}
	defer b.pool.remove(names)
	dir := filepath.Join(b.work, "cycles")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	d, err := b.startDaemon(dir)
	if err != nil {
		return nil, err
	}
	defer b.stopDaemon(d)
	if _, err := d.waitServing(ctx, time.Minute); err != nil {
		return nil, err
	}
	run := func(total int) error {
		var wg sync.WaitGroup
		errs := make([]error, conc)
		for w := range conc {
			wg.Go(func() {
				for j := range total / conc {
					k := w*perWorker + j%perWorker
					uid := fmt.Sprintf("cycle-%d", k)
					if _, err := d.client.AddPod(ctx, addRequest(uid, names[k], podIP(names[k]))); err != nil {
						errs[w] = fmt.Errorf("cycle AddPod %s: %w", names[k], err)
						return
					}
					if _, err := d.client.RemovePod(ctx, uid); err != nil {
						errs[w] = fmt.Errorf("cycle RemovePod %s: %w", names[k], err)
						return
					}
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return ctx.Err()
	}
	// Warm up first: the runtime's heap and gRPC's buffers reach their
	// working size in the first cycles, which is not growth.
	if err := run(max(conc, b.cfg.cycles/20)); err != nil {
		return nil, err
	}
	b.sleep(ctx, idleSettle)
	if res.before.rss, res.before.fds, err = ownResources(d.pid()); err != nil {
		return nil, err
	}
	res.series = append(res.series, res.before)
	chunks := 10
	t0 := time.Now()
	done := 0
	for c := range chunks {
		n := res.cycles/chunks + boolInt(c < res.cycles%chunks)
		if err := run(n); err != nil {
			return nil, err
		}
		done += n / conc * conc
		p := point{cycles: done}
		if p.rss, p.fds, err = ownResources(d.pid()); err != nil {
			return nil, err
		}
		res.series = append(res.series, p)
		b.progress("  %d cycles: RssAnon %s, fds %d", done, mib(p.rss), p.fds)
	}
	res.wall = time.Since(t0)
	res.cycles = done
	b.sleep(ctx, idleSettle)
	res.after = point{cycles: done}
	if res.after.rss, res.after.fds, err = ownResources(d.pid()); err != nil {
		return nil, err
	}
	return res, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
