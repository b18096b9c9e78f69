package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	nftstate "github.com/nftredir/nftredir/state"
)

// crashPod is one pod of TestDaemonCrash. The first few have a peer, the
// stand-in proxy and an application, so their state is also checked with
// real TCP; the rest are bare namespaces, checked with nft and ip.
type crashPod struct {
	uid  string
	ns   *nstest.Netns
	full *pod
}

type opOutcome int

const (
	opOK      opOutcome = iota
	opError             // the daemon answered with an error: by contract nothing changed
	opNoReply           // cut off by the kill: may or may not have taken effect
)

func (o opOutcome) String() string {
	return [...]string{"OK", "error", "no reply"}[o]
}

// crashOp is one AddPod or RemovePod of a burst, with when it was sent and
// when its reply (or failure) came back.
type crashOp struct {
	pod int
	add bool
	// teardown: a RemovePod with namespace_teardown, as CNI DEL sends.
	teardown   bool
	start, end time.Time
	outcome    opOutcome
	err        error
}

func (o crashOp) String() string {
	verb := "RemovePod"
	switch {
	case o.add:
		verb = "AddPod"
	case o.teardown:
		verb = "RemovePod(namespace_teardown)"
	}
	s := fmt.Sprintf("%s %s..%s %s", verb, o.start.Format("15:04:05.000000"), o.end.Format("15:04:05.000000"), o.outcome)
	if o.err != nil {
		s += fmt.Sprintf(" (%v)", o.err)
	}
	return s
}

// possibleStates returns the states (enrolled or not) a pod may be in
// after ops, given its state before them. An op's effect may be the final
// state unless an op that returned OK certainly started after it had
// finished; an op without a reply may have taken effect at any moment
// until the kill, so nothing certainly follows it. The initial state
// remains possible only if no op certainly took effect.
func possibleStates(initial bool, ops []crashOp) map[bool]bool {
	out := map[bool]bool{}
	anyOK := false
	for _, x := range ops {
		if x.outcome == opOK {
			anyOK = true
		}
		if x.outcome == opError {
			continue
		}
		overridden := false
		if x.outcome == opOK {
			for _, y := range ops {
				if y.outcome == opOK && y.start.After(x.end) {
					overridden = true
					break
				}
			}
		}
		if !overridden {
			out[x.add] = true
		}
	}
	if !anyOK {
		out[initial] = true
	}
	return out
}

// burst runs workers goroutines of random AddPod and RemovePod calls over
// pods until the daemon is killed, delay after the start, and returns every
// call that could have reached the daemon.
func burst(t *testing.T, d *nftredird, pods []*crashPod, workers int, delay time.Duration, seed uint64) []crashOp {
	t.Helper()
	// One attempt per call: a retry would hide the kill and blur which
	// daemon answered.
	c, err := client.Dial(t.Context(), d.socket, client.WithRetry(1, 0), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var (
		mu      sync.Mutex
		ops     []crashOp
		wg      sync.WaitGroup
		stopped atomic.Bool
	)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for !stopped.Load() {
				op := crashOp{pod: rng.IntN(len(pods)), add: rng.IntN(5) < 3, teardown: rng.IntN(2) == 0}
				p := pods[op.pod]
				op.start = time.Now()
				if op.add {
					_, op.err = c.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: p.uid, PodName: p.ns.Name, PodNamespace: "e2e", NetnsPath: p.ns.Path})
				} else if op.teardown {
					_, op.err = c.RemovePod(t.Context(), p.uid, client.NamespaceTeardown())
				} else {
					_, op.err = c.RemovePod(t.Context(), p.uid)
				}
				op.end = time.Now()
				mu.Lock()
				ops = append(ops, op)
				mu.Unlock()
				if op.err != nil {
					return
				}
			}
		})
	}
	time.Sleep(delay)
	killAt := time.Now()
	d.kill(t)
	deadAt := time.Now()
	stopped.Store(true)
	wg.Wait()

	var kept []crashOp
	for _, op := range ops {
		switch {
		case op.err == nil:
			op.outcome = opOK
		case op.end.Before(killAt):
			op.outcome = opError
			t.Errorf("pod %s: %s before the kill; every call of the burst is valid", pods[op.pod].uid, op)
		case op.start.After(deadAt):
			continue // sent to a dead daemon
		default:
			op.outcome = opNoReply
		}
		kept = append(kept, op)
	}
	return kept
}

// TestDaemonCrash kills the daemon with SIGKILL in the middle of a burst of
// concurrent AddPod and RemovePod calls, restarts it, and requires every
// pod to be fully enrolled or fully absent, as the replies allow. It does
// so several times, at random moments, each round starting from what the
// last one left.
func TestDaemonCrash(t *testing.T) {
	nstest.RequirePrivileged(t)
	const (
		nPods    = 30
		nSampled = 3
		workers  = 6
		rounds   = 3
	)
	// Half the releases leave the namespace to its deletion, which never
	// comes here: the daemon removes the capture itself after the grace.
	d := startDaemon(t, daemonOpts{args: []string{"--teardown-grace", crashTeardownGrace.String()}})
	pods := make([]*crashPod, nPods)
	for i := range pods {
		p := &crashPod{uid: fmt.Sprintf("e2e-crash-%02d", i)}
		if i < nSampled {
			p.full = newPod(t, variant{mode: nft.ModeTProxy})
			p.ns = p.full.Pod
		} else {
			p.ns = nstest.NewNetns(t)
		}
		pods[i] = p
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	state := make([]bool, nPods) // verified enrolment after the previous round
	for round := range rounds {
		delay := time.Duration(20+rand.IntN(300)) * time.Millisecond
		ops := burst(t, d, pods, workers, delay, seed+uint64(round))
		counts := map[string]int{}
		for _, op := range ops {
			counts[fmt.Sprintf("%v/%s", map[bool]string{true: "add", false: "remove"}[op.add], op.outcome)]++
		}
		t.Logf("round %d: killed after %s: %v", round, delay, counts)
		d.start(t)
		// Pods the kill caught between record and kernel show up here as
		// repaired: evidence that the kill landed mid-operation.
		if done := d.logEntries(t, "reconcile done"); len(done) > 0 {
			last := done[len(done)-1]
			t.Logf("round %d: startup reconcile of %v records: in_sync=%v repaired=%v dropped=%v failed=%v",
				round, last["pods"], last["in_sync"], last["repaired"], last["dropped"], last["failed"])
		}
		checkCrashRound(t, d, pods, state, ops)
		if t.Failed() {
			t.Fatalf("round %d (seed %d) left pods inconsistent; see above", round, seed)
		}
	}
	if entries, err := os.ReadDir(filepath.Join(d.stateDir, "quarantine")); err == nil && len(entries) > 0 {
		t.Errorf("%d records were quarantined as corrupt; records must be replaced atomically", len(entries))
	}
}

// checkCrashRound classifies each pod as enrolled or absent (failing for
// anything in between), requires that to be a state the replies allow, and
// records it in state for the next round.
func checkCrashRound(t *testing.T, d *nftredird, pods []*crashPod, state []bool, ops []crashOp) {
	t.Helper()
	// A pod released for its namespace's teardown keeps its capture until
	// the daemon, restarted or not, settles the namespace after the grace.
	left := filepath.Join(d.stateDir, nftstate.TeardownDir)
	for deadline := time.Now().Add(crashTeardownGrace + 10*time.Second); ; time.Sleep(50 * time.Millisecond) {
		files, err := os.ReadDir(left)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if len(files) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records left for teardown are still unsettled %s after the restart", len(files), crashTeardownGrace+10*time.Second)
		}
	}
	c := d.client(t)
	listed := map[string]bool{}
	for _, uid := range listUIDs(t, c) {
		listed[uid] = true
	}
	enrolledCount := 0
	for i, p := range pods {
		var history []string
		var mine []crashOp
		for _, op := range ops {
			if op.pod == i {
				mine = append(mine, op)
				history = append(history, "  "+op.String())
			}
		}
		slices.Sort(history)
		explain := fmt.Sprintf("before the round: enrolled=%v; calls:\n%s", state[i], strings.Join(history, "\n"))

		resp := getPod(t, c, p.uid)
		s := observePod(t, p.ns)
		var enrolled bool
		switch {
		case listed[p.uid] && resp != nil &&
			resp.GetSyncStatus() == nftredirv1.SyncStatus_SYNC_STATUS_IN_SYNC &&
			resp.GetPod().GetNetnsPath() == p.ns.Path && s.enrolled():
			enrolled = true
		case !listed[p.uid] && resp == nil && s.absent():
			enrolled = false
		default:
			t.Errorf("pod %s is neither fully enrolled nor fully absent: listed=%v GetPod=%v (%s) namespace shows %s\n%s",
				p.uid, listed[p.uid], resp.GetSyncStatus(), resp.GetDetail(), s, explain)
			continue
		}
		if ok := possibleStates(state[i], mine); !ok[enrolled] {
			t.Errorf("pod %s: enrolled=%v after the restart, which the replies rule out\n%s", p.uid, enrolled, explain)
		}
		if p.full != nil {
			want := app
			if enrolled {
				want = nstest.ProxyInbound
			}
			r := p.full.expect(t, p.full.Peer, nstest.Dial{Network: "tcp4", To: netip.AddrPortFrom(nstest.V4.Pod, appPort)}, want)
			if enrolled {
				wantInbound(t, nft.ModeTProxy, r, netip.AddrPortFrom(nstest.V4.Pod, appPort))
			}
		}
		state[i] = enrolled
		if enrolled {
			enrolledCount++
		}
	}
	t.Logf("after the restart: %d of %d pods enrolled, the rest absent", enrolledCount, len(pods))
}

// crashTeardownGrace is the daemon's --teardown-grace in TestDaemonCrash.
const crashTeardownGrace = 300 * time.Millisecond

// TestDaemonCrashModel pins down possibleStates, the judge of
// TestDaemonCrash, on histories whose answer is known. It needs no root.
func TestDaemonCrashModel(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	op := func(add bool, start, end int, o opOutcome) crashOp {
		return crashOp{add: add, start: at(start), end: at(end), outcome: o}
	}
	const add, remove = true, false
	for _, tc := range []struct {
		name    string
		initial bool
		ops     []crashOp
		want    []bool
	}{
		{"no calls", add, nil, []bool{add}},
		{"acknowledged add", remove, []crashOp{op(add, 0, 1, opOK)}, []bool{add}},
		{"acknowledged remove", add, []crashOp{op(remove, 0, 1, opOK)}, []bool{remove}},
		{"add then remove", remove, []crashOp{op(add, 0, 1, opOK), op(remove, 2, 3, opOK)}, []bool{remove}},
		{"overlapping add and remove", remove, []crashOp{op(add, 0, 3, opOK), op(remove, 1, 2, opOK)}, []bool{add, remove}},
		{"unanswered add", remove, []crashOp{op(add, 0, 1, opNoReply)}, []bool{add, remove}},
		{"remove then unanswered add", add, []crashOp{op(remove, 0, 1, opOK), op(add, 2, 3, opNoReply)}, []bool{add, remove}},
		{"unanswered remove then later add", remove, []crashOp{op(remove, 0, 1, opNoReply), op(add, 2, 3, opOK)}, []bool{add, remove}},
		{"refused add changes nothing", remove, []crashOp{op(add, 0, 1, opError)}, []bool{remove}},
	} {
		got := possibleStates(tc.initial, tc.ops)
		var gotList []bool
		for _, s := range []bool{add, remove} {
			if got[s] {
				gotList = append(gotList, s)
			}
		}
		if !slices.Equal(gotList, tc.want) {
			t.Errorf("%s: possible enrolled states %v; want %v", tc.name, gotList, tc.want)
		}
	}
}
