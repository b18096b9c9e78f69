package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// sample is one method measured once: one latency per pod (or per
// connection), the wall time of the whole batch and the CPU it cost.
type sample struct {
	method string
	rep    int
	conc   int
	lat    []time.Duration
	wall   time.Duration
	cpu    time.Duration
	load   float64 // 1-minute load average when the sample started
	// phases splits the exec-based baselines into their commands.
	phases map[string][]time.Duration
	// inDaemon is each call's time inside the daemon, from its log.
	inDaemon []time.Duration
}

func (s *sample) p50() float64  { return msf(newDist(s.lat).q(0.5)) }
func (s *sample) p99() float64  { return msf(newDist(s.lat).q(0.99)) }
func (s *sample) rate() float64 { return float64(len(s.lat)) / s.wall.Seconds() }
func (s *sample) cpuPer() float64 {
	if len(s.lat) == 0 {
		return 0
	}
	return msf(s.cpu) / float64(len(s.lat))
}

// Method names, as the report shows them.
const (
	mIPT = "iptables-restore + 2× ip"
	mNFT = "nft -f + 2× ip"
)

func mAdd(conc int) string { return fmt.Sprintf("nftredir AddPod, %d concurrent", conc) }

// rpcName is the RPC a method name measures.
func rpcName(method string) string {
	if strings.Contains(method, "RemovePod") {
		return "RemovePod"
	}
	return "AddPod"
}
func mRemove(conc int) string { return fmt.Sprintf("nftredir RemovePod, %d concurrent", conc) }

// peerRulesetTemplate is the peer's in-pod TPROXY ruleset (Istio's tproxy.golden
// before it switched to REDIRECT), loaded as it did with
// `iptables-restore --noflush`. Two changes make it do what nftredir's
// ruleset does and no more: the DNS lines and the raw table are left out
// (nftredir captures DNS only when asked, and the benchmark does not ask),
// and one `-m socket --transparent` MARK rule is added before the
// established-accept, without which tproxied connections to addresses the
// pod does not own lose their handshake's ACK (nftredir has the same rule).
// IPv4 only: IPv6 would take a second ip6tables-restore, which nftredir's
// inet table does not need; leaving it out favours the baseline.
const peerRulesetTemplate = `* mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark $PROXY_MARK -j CONNMARK --set-xmark $TPROXY_MARK
-A ISTIO_PRERT -s $PROBE_V4 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -i lo -j ACCEPT
-A ISTIO_PRERT -p tcp -m tcp --dport $HBONE -m mark ! --mark $PROXY_MARK -j TPROXY --on-port $HBONE --tproxy-mark $TPROXY_MARK
-A ISTIO_PRERT -p tcp -m socket --transparent -j MARK --set-xmark $TPROXY_MARK
-A ISTIO_PRERT -p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark $PROXY_MARK -j TPROXY --on-port $INBOUND --tproxy-mark $TPROXY_MARK
-A ISTIO_OUTPUT -m connmark --mark $TPROXY_MARK -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
* nat
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -d $PROBE_V4 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -p tcp -m mark --mark $TPROXY_MARK -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark $PROXY_MARK -j REDIRECT --to-ports $OUTBOUND
COMMIT
`

// peerRuleset is peerRulesetTemplate with the marks, ports and probe
// source of package defaults, the same ones nftredir's default spec uses.
func peerRuleset() string {
	mark := func(v uint32) string { return fmt.Sprintf("%#x/%#x", v, defaults.MarkMask) }
	port := func(p uint16) string { return strconv.Itoa(int(p)) }
	return strings.NewReplacer(
		"$PROXY_MARK", mark(defaults.ProxyMark),
		"$TPROXY_MARK", mark(defaults.TProxyMark),
		"$PROBE_V4", defaults.ProbeSourceV4().String(),
		"$OUTBOUND", port(defaults.OutboundPort),
		"$INBOUND", port(defaults.InboundPort),
		"$HBONE", port(defaults.HBONEPort),
	).Replace(peerRulesetTemplate)
}

// peerRules is the number of -A lines in peerRuleset and peerTProxyRules
// the number of them that TPROXY, checked after loading it.
const (
	peerRules       = 15
	peerTProxyRules = 2
)

// step is one command of an exec-based method.
type step struct {
	name  string
	args  []string
	stdin string
}

// policyRouting is the ip rule and route every method installs, as the
// peer installs them.
func policyRouting(ns string) []step {
	return []step{
		{name: "ip rule", args: []string{"ip", "-n", ns, "rule", "add", "fwmark", fmt.Sprintf("%#x/%#x", defaults.TProxyMark, defaults.MarkMask),
			"pref", strconv.Itoa(defaults.RulePriority), "lookup", strconv.Itoa(defaults.RouteTable)}},
		{name: "ip route", args: []string{"ip", "-n", ns, "route", "replace", "local", "default", "dev", "lo", "table", strconv.Itoa(defaults.RouteTable)}},
	}
}

func iptablesSteps(ns string) []step {
	return append([]step{{
		name:  "iptables-restore",
		args:  []string{"ip", "netns", "exec", ns, "iptables-restore", "--noflush"},
		stdin: peerRuleset(),
	}}, policyRouting(ns)...)
}

// nftScript is nftredir's own ruleset as `nft -f` input. The add+delete
// prefix makes it an atomic replace, as nftredir's apply is.
func nftScript(uid string) (string, error) {
	rs, err := nft.Build(nft.DefaultSpec(uid))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("table inet %[1]s\ndelete table inet %[1]s\n%s", nft.TableName, rs.String()), nil
}

func nftSteps(ns, script string) []step {
	return append([]step{{
		name:  "nft -f",
		args:  []string{"ip", "netns", "exec", ns, "nft", "-f", "-"},
		stdin: script,
	}}, policyRouting(ns)...)
}

func (s step) run() error {
	cmd := exec.Command(s.args[0], s.args[1:]...)
	if s.stdin != "" {
		cmd.Stdin = strings.NewReader(s.stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(s.args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// parallel calls fn(0..n-1) from conc goroutines and returns the first
// error; after an error or cancellation no new calls start.
func parallel(ctx context.Context, n, conc int, fn func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range min(conc, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// addRequest is a CNI plugin's AddPod for the pod in namespace ns.
func addRequest(uid, ns, ip string) *nftredirv1.AddPodRequest {
	return &nftredirv1.AddPodRequest{
		PodUid:       uid,
		PodName:      uid,
		PodNamespace: "bench",
		NetnsPath:    nsPath(ns),
		PodIps:       []string{ip},
	}
}

// podIP gives each namespace its own pod address, as a node's IPAM
// would, so the daemon's node probe set holds one element per pod. It
// is derived from the namespace's sequence number, in 10.128.0.0/10,
// away from the data path's addresses.
func podIP(ns string) string {
	i := len(ns)
	for i > 0 && ns[i-1] >= '0' && ns[i-1] <= '9' {
		i--
	}
	n, _ := strconv.Atoi(ns[i:])
	return fmt.Sprintf("10.%d.%d.%d", 128+(n>>16)&63, (n>>8)&255, n&255)
}

// addPodSample enrols N fresh namespaces through the daemon at conc
// calls in flight, timing each call from the client's side, then releases
// them the same way. With baseline the daemon is the earlier build's: the samples get its
// method names and its tables are checked against its own rule count.
func (b *bench) addPodSample(ctx context.Context, d *daemon, conc, rep int, baseline bool) (add, remove *sample, err error) {
	addName, removeName, wantRules := mAdd(conc), mRemove(conc), &b.wantRules
	if baseline {
		addName, removeName, wantRules = mAddBase(conc), mRemoveBase(conc), &b.baseRules
	}
	n := b.cfg.pods
	names, err := b.pool.create(n, "a")
	if err != nil {
		return nil, nil, err
	}
	defer b.pool.remove(names)
	uid := func(i int) string { return fmt.Sprintf("bench-%d-%s", rep, names[i][len(b.pool.prefix):]) }

	run := func(method string, op func(i int) error) (*sample, error) {
		s := &sample{method: method, rep: rep, conc: conc, lat: make([]time.Duration, n), load: loadAvg()}
		d0, err := procCPU(d.pid())
		if err != nil {
			return nil, err
		}
		c0 := selfAndChildrenCPU()
		mark := d.logSize()
		t0 := time.Now()
		err = parallel(ctx, n, conc, func(i int) error {
			start := time.Now()
			err := op(i)
			s.lat[i] = time.Since(start)
			return err
		})
		s.wall = time.Since(t0)
		d1, _ := procCPU(d.pid())
		s.cpu = d1 - d0 + selfAndChildrenCPU() - c0
		if err != nil {
			return nil, err
		}
		// The daemon logs a call before replying, but through a queue that
		// one goroutine drains: the last lines may land a moment after
		// the replies.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			s.inDaemon, err = d.callTimes(mark, d.logSize(), rpcName(method))
			if err != nil || len(s.inDaemon) >= n || time.Now().After(deadline) {
				break
			}
		}
		if err == nil && len(s.inDaemon) != n {
			err = fmt.Errorf("the daemon's log shows %d %s calls, want %d", len(s.inDaemon), rpcName(method), n)
		}
		return s, err
	}
	add, err = run(addName, func(i int) error {
		_, err := d.client.AddPod(ctx, addRequest(uid(i), names[i], podIP(names[i])))
		if err != nil {
			return fmt.Errorf("AddPod %s: %w", names[i], err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, i := range []int{0, n - 1} {
		if err := b.verifyTable(names[i], true, wantRules); err != nil {
			return nil, nil, err
		}
	}
	remove, err = run(removeName, func(i int) error {
		existed, err := d.client.RemovePod(ctx, uid(i))
		if err == nil && !existed {
			err = errors.New("the daemon did not know the pod")
		}
		if err != nil {
			return fmt.Errorf("RemovePod %s: %w", names[i], err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, i := range []int{0, n - 1} {
		if err := b.verifyTable(names[i], false, wantRules); err != nil {
			return nil, nil, err
		}
	}
	return add, remove, nil
}

// cliSample programs N fresh namespaces one after another with an
// exec-based method, as a script-driven agent does.
func (b *bench) cliSample(ctx context.Context, method string, rep int) (*sample, error) {
	n := b.cfg.pods
	names, err := b.pool.create(n, "c")
	if err != nil {
		return nil, err
	}
	defer b.pool.remove(names)
	script, err := nftScript("bench-pod")
	if err != nil {
		return nil, err
	}
	s := &sample{method: method, rep: rep, conc: 1, lat: make([]time.Duration, n), load: loadAvg(), phases: map[string][]time.Duration{}}
	c0 := selfAndChildrenCPU()
	t0 := time.Now()
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		steps := iptablesSteps(name)
		if method == mNFT {
			steps = nftSteps(name, script)
		}
		start := time.Now()
		for _, st := range steps {
			ps := time.Now()
			if err := st.run(); err != nil {
				return nil, err
			}
			s.phases[st.name] = append(s.phases[st.name], time.Since(ps))
		}
		s.lat[i] = time.Since(start)
	}
	s.wall = time.Since(t0)
	s.cpu = selfAndChildrenCPU() - c0
	for _, i := range []int{0, n - 1} {
		var err error
		if method == mNFT {
			err = b.verifyNftredir(names[i], true)
		} else {
			err = b.verifyPeer(names[i])
		}
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// verifyNftredir checks, through netlink, that the namespace has our table
// with every rule of the default spec and the policy routing (or, with
// want false, neither).
func (b *bench) verifyNftredir(name string, want bool) error {
	return b.verifyTable(name, want, &b.wantRules)
}

// verifyTable is verifyNftredir against a rule count of *wantRules; a
// count of 0 is learnt from the first table it finds, for a build whose
// ruleset this program cannot build.
func (b *bench) verifyTable(name string, want bool, wantRules *int) error {
	h, err := b.guard.Open(nsPath(name))
	if err != nil {
		return err
	}
	defer h.Close()
	rules, err := countRules(h.Fd(), nftables.TableFamilyINet, nft.TableName)
	if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}
	rt, err := netns.InspectRouting(h, netns.DefaultRouting())
	if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}
	if want && *wantRules == 0 && rules > 0 {
		*wantRules = rules
	}
	switch {
	case want && rules <= 0:
		return fmt.Errorf("verify %s: table %s missing or empty after AddPod (%d rules)", name, nft.TableName, rules)
	case want && rules != *wantRules:
		return fmt.Errorf("verify %s: table %s has %d rules, want %d", name, nft.TableName, rules, *wantRules)
	case want && !rt.V4Rule, want && !rt.V4Route:
		return fmt.Errorf("verify %s: policy routing incomplete: %+v", name, rt)
	case !want && rules >= 0:
		return fmt.Errorf("verify %s: table %s still present after RemovePod", name, nft.TableName)
	case !want && !rt.Absent():
		return fmt.Errorf("verify %s: policy routing left after RemovePod: %+v", name, rt)
	}
	return nil
}

// countRules returns the number of rules in a table, or -1 when the table
// does not exist.
func countRules(fd int, fam nftables.TableFamily, table string) (int, error) {
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return 0, err
	}
	if _, err := c.ListTableOfFamily(table, fam); err != nil {
		if nft.IsNotFound(err) {
			return -1, nil
		}
		return 0, err
	}
	chains, err := c.ListChainsOfTableFamily(fam)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return 0, err
		}
		n += len(rules)
	}
	return n, nil
}

// verifyPeer checks the loaded iptables ruleset with iptables-save (the
// xt expressions iptables-nft writes do not all decode through netlink)
// and the policy routing through netlink.
func (b *bench) verifyPeer(name string) error {
	out, err := exec.Command("ip", "netns", "exec", name, "iptables-save").CombinedOutput()
	if err != nil {
		return fmt.Errorf("verify %s: iptables-save: %w: %s", name, err, out)
	}
	text := string(out)
	if got := strings.Count(text, "\n-A "); got != peerRules || strings.Count(text, "-j TPROXY") != peerTProxyRules {
		return fmt.Errorf("verify %s: iptables-save shows %d rules (want %d, %d of them TPROXY):\n%s", name, got, peerRules, peerTProxyRules, text)
	}
	h, err := b.guard.Open(nsPath(name))
	if err != nil {
		return err
	}
	defer h.Close()
	rt, err := netns.InspectRouting(h, netns.DefaultRouting())
	if err != nil {
		return err
	}
	if !rt.V4Rule || !rt.V4Route {
		return fmt.Errorf("verify %s: policy routing incomplete: %+v", name, rt)
	}
	return nil
}
