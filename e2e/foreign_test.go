package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// Istio's ztunnel stand-in answers with these names, on Istio's ports
// (which are also our defaults): the foreign capture's proxy. Ours
// listens on other ports (ourPorts), so every answer says whose capture
// took the connection.
const (
	istioOutbound = "istio-outbound"
	istioInbound  = "istio-inbound"
)

var ourPorts = nstest.ProxyPorts{Outbound: 15101, Inbound: 15106, HBONE: 15108, DNS: 15153, Mark: proxyMark}

// iptablesIn runs an iptables variant inside the pod, feeding it stdin.
func iptablesIn(t *testing.T, ns *nstest.Netns, stdin string, cmd string, args ...string) {
	t.Helper()
	c := exec.Command("ip", append([]string{"netns", "exec", ns.Name, cmd}, args...)...)
	c.Stdin = strings.NewReader(stdin)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", cmd, strings.Join(args, " "), err, out)
	}
}

// installIstio installs istio-cni's in-pod rules with iptables-nft, for
// both families as istio-cni does with IPv6 on, and a rule of the CNI's
// own in the same nat tables, which take-over must leave alone.
func installIstio(t *testing.T, p *pod) {
	t.Helper()
	iptablesIn(t, p.Pod, capturetest.IstioInpodRules(capturetest.IstioV4[0], capturetest.IstioV4[1]), "iptables-nft-restore", "--noflush")
	iptablesIn(t, p.Pod, capturetest.IstioInpodRules(capturetest.IstioV6[0], capturetest.IstioV6[1]), "ip6tables-nft-restore", "--noflush")
	for _, cmd := range []string{"iptables-nft", "ip6tables-nft"} {
		iptablesIn(t, p.Pod, "", cmd, "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-p", "udp", "--dport", "9999", "-j", "MASQUERADE")
	}
}

// startIstioProxy starts the stand-in for the ztunnel istio-cni's rules
// point at: transparent, marked listeners on Istio's outbound and inbound
// ports.
func startIstioProxy(t *testing.T, p *pod) {
	t.Helper()
	opts := nstest.Sockopts{Mark: proxyMark, Transparent: true}
	for _, l := range []struct {
		name string
		port uint16
	}{{istioOutbound, 15001}, {istioInbound, 15006}} {
		p.Pod.Listen(t, p.rec, nstest.Listen{Name: l.name, Network: "tcp", Addr: netip.AddrPortFrom(nstest.V6.Any, l.port), Sockopts: opts})
	}
}

// ourSpec is the variant's spec with our proxy on ourPorts.
func (p *pod) ourSpec() nft.Spec {
	s := p.spec()
	s.OutboundPort, s.InboundPort, s.InboundHBONEPort, s.DNSPort = ourPorts.Outbound, ourPorts.Inbound, ourPorts.HBONE, ourPorts.DNS
	return s
}

func (p *pod) engine(t *testing.T, takeOver bool) *capture.Kernel {
	t.Helper()
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	return capture.NewKernel(g, nft.NewNetlink(), capture.TakeOverForeign(takeOver))
}

// tally counts who answered the probes, per direction.
type tally struct {
	mu      sync.Mutex
	by      map[string]int
	errs    []error
	lastOld time.Time // when a probe the old capture answered started, the latest
}

func (c *tally) add(dir, who string, start time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w", dir, err))
		return
	}
	c.by[dir+" "+who]++
	if strings.HasPrefix(who, "istio-") && start.After(c.lastOld) {
		c.lastOld = start
	}
}

// TestTakeOverIstioCNI: a pod captured by istio-cni's iptables-nft rules
// (Istio's ruleset and ports, both families) is taken over: afterwards
// its chains are gone, the CNI's own rule in the same table is not, and
// every new connection, outbound and inbound, lands on our proxy with its
// original destination. Probes dial without pause through the take-over,
// and none of them reaches the app or the server uncaptured: the swap is
// one kernel transaction, so there is no window.
func TestTakeOverIstioCNI(t *testing.T) {
	withoutProxy(t, variants, func(t *testing.T, p *pod) {
		installIstio(t, p)
		startIstioProxy(t, p)
		nstest.StartProxy(t, p.Pod, p.rec, ourPorts)
		out, in := p.to(p.a.Peer, serverPort), p.to(p.a.Pod, appPort)
		// Istio's capture is live: both directions reach its proxy.
		p.expect(t, p.Pod, out, istioOutbound)
		p.expect(t, p.Peer, in, istioInbound)

		// Opened before the probes start: they enter namespaces on
		// locked threads, and the guard reads the node's namespace from
		// /proc/self, the main thread's, which a probe may be holding.
		ns, err := p.engine(t, true).Open(p.Pod.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		c := &tally{by: map[string]int{}}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			for _, d := range []struct {
				dir  string
				from *nstest.Netns
				dial nstest.Dial
			}{{"out", p.Pod, out}, {"in", p.Peer, in}} {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						r, err := d.from.Exchange(p.rec, d.dial)
						c.add(d.dir, r.Listener, start, err)
					}
				})
			}
		}
		time.Sleep(150 * time.Millisecond)
		rs := build(t, p.ourSpec())
		began := time.Now()
		_, err = ns.Apply(t.Context(), rs, netns.DefaultRouting())
		took := time.Since(began)
		time.Sleep(150 * time.Millisecond)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("take-over: %v", err)
		}
		t.Logf("take-over took %v; probes: %v, %d errors; last probe answered by Istio's proxy started %v after the take-over began",
			took, c.by, len(c.errs), c.lastOld.Sub(began))
		for _, e := range c.errs {
			t.Errorf("probe failed: %v", e)
		}
		for who, n := range c.by {
			if strings.HasSuffix(who, " "+app) || strings.HasSuffix(who, " "+server) {
				t.Errorf("%d probes %s: not captured during the take-over", n, who)
			}
		}
		if c.by["out "+nstest.ProxyOutbound] == 0 || c.by["out "+istioOutbound] == 0 {
			t.Errorf("the probes did not span the take-over: %v", c.by)
		}
		if c.lastOld.After(began.Add(took)) {
			t.Errorf("a probe started %v after the take-over ended was still captured by Istio's rules", c.lastOld.Sub(began.Add(took)))
		}

		// Only ours is left, and it captures each connection once, with
		// its original destination.
		ruleset := p.Pod.Nft(t, "list", "ruleset")
		if strings.Contains(ruleset, "ISTIO_") {
			t.Errorf("Istio's chains survived the take-over:\n%s", ruleset)
		}
		for _, fam := range []string{"ip", "ip6"} {
			if post := p.Pod.Nft(t, "list", "chain", fam, "nat", "POSTROUTING"); !strings.Contains(post, "masquerade") {
				t.Errorf("the CNI's own %s nat rule is gone:\n%s", fam, post)
			}
		}
		if st, text := p.verify(t, rs); st != nft.StatusInSync {
			t.Errorf("our table after take-over is %v:\n%s", st, text)
		}
		p.wantOutbound(t, p.expect(t, p.Pod, out, nstest.ProxyOutbound), nstest.ProxyOutbound, out.To)
		r := p.expect(t, p.Peer, in, nstest.ProxyInbound)
		if p.v.mode == nft.ModeTProxy && r.Local != in.To {
			t.Errorf("TPROXY: accepted with local address %s; want %s", r.Local, in.To)
		}
		if p.v.mode == nft.ModeRedirect && (r.OrigDst != in.To || r.Local.Port() != ourPorts.Inbound) {
			t.Errorf("REDIRECT: %s; want original destination %s on port %d", r, in.To, ourPorts.Inbound)
		}
	})
}

// TestForeignCaptureRefused: with take-over off, a pod with istio-cni's
// rules is refused and they keep capturing; a pod with legacy iptables
// rules is refused even with take-over on. Nothing is changed: not the
// nftables ruleset, not the legacy rules, not the routing.
func TestForeignCaptureRefused(t *testing.T) {
	withoutProxy(t, []variant{{false, nft.ModeTProxy}, {false, nft.ModeRedirect}}, func(t *testing.T, p *pod) {
		startIstioProxy(t, p)
		for _, tc := range []struct {
			name     string
			install  func()
			takeOver bool
			names    string
		}{
			{"iptables-nft, take-over off", func() { installIstio(t, p) }, false, "iptables-nft chain ip nat ISTIO_OUTPUT"},
			{"legacy, take-over on", func() {
				// istio-cni's iptables-nft rules go, legacy ones come.
				for _, cmd := range []string{"iptables-nft", "ip6tables-nft"} {
					for _, table := range []string{"nat", "mangle", "raw"} {
						iptablesIn(t, p.Pod, "", cmd, "-t", table, "-F")
						iptablesIn(t, p.Pod, "", cmd, "-t", table, "-X")
					}
				}
				iptablesIn(t, p.Pod, "", "iptables-legacy", strings.Fields(capturetest.LegacyRule)...)
			}, true, "legacy iptables table nat"},
		} {
			tc.install()
			before := dumpAll(t, p)
			// Opened now, as AddPod opens the path it is given: a handle
			// knows the legacy tables as they were when it first entered
			// the namespace (at Open, or at Apply).
			eng := p.engine(t, tc.takeOver)
			ns, err := eng.Open(p.Pod.Path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ns.Apply(t.Context(), build(t, p.spec()), netns.DefaultRouting())
			ns.Close()
			if !errors.Is(err, capture.ErrForeignCapture) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("%s: Apply = %v; want ErrForeignCapture naming %q", tc.name, err, tc.names)
			}
			t.Logf("%s: %v", tc.name, err)
			if after := dumpAll(t, p); after != before {
				t.Errorf("%s: refusal changed the namespace\n--- before\n%s\n--- after\n%s", tc.name, before, after)
			}
			// Their capture still works: outbound reaches their proxy.
			p.expect(t, p.Pod, p.to(p.a.Peer, serverPort), istioOutbound)
		}
	})
}

// withoutProxy runs f for each of vs in parallel, on pods whose proxy
// stand-in is not started: the test starts the proxies it needs.
func withoutProxy(t *testing.T, vs []variant, f func(t *testing.T, p *pod)) {
	nstest.RequirePrivileged(t)
	for _, v := range vs {
		t.Run(v.String(), func(t *testing.T) {
			if v.v6 && !nstest.HaveIPv6() {
				t.Skip("kernel without IPv6")
			}
			t.Parallel()
			f(t, newPodWithoutProxy(t, v))
		})
	}
}

// dumpAll is the pod's nftables ruleset, legacy rules and policy routing,
// without counter values or dates: the namespace's own IPv6 traffic (MLD,
// router solicitations) moves the foreign rules' counters meanwhile.
func dumpAll(t *testing.T, p *pod) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString(p.Pod.Nft(t, "-s", "list", "ruleset"))
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		for l := range strings.Lines(p.Pod.Run(t, save)) {
			if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, ":") {
				sb.WriteString(l)
			}
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		sb.WriteString(p.Pod.IP(t, fam, "rule", "show"))
		sb.WriteString(p.Pod.IP(t, fam, "route", "show", "table", "all"))
	}
	return sb.String()
}

// TestOrderAgainstIptablesNft: iptables-nft's own chains in the pod, not
// capture to take over (a CNI's DNAT in nat OUTPUT at -100, a mark rule
// in mangle PREROUTING at -150), lose to ours deterministically, whatever
// order the chains were created in. At equal priority the kernel runs the
// chain registered last first (nf_hook_entries_grow inserts a hook before
// the first one of equal or higher priority), so the test creates them in
// the order that would make ours lose at equal priority: the mark rule
// before our table (it would run after ours at -150 and clear the tproxy
// mark), the DNAT after it (it would run first at -100 and take the
// connection). Their rules stay in place.
func TestOrderAgainstIptablesNft(t *testing.T) { testOrderAgainst(t, "nft") }

// TestOrderAgainstIptablesLegacy is the same with legacy iptables rules,
// added around an enrolled pod (a pod that has them when it is enrolled is
// refused): xtables hooks its nat into the same list as nft's nat chains
// and its mangle at -150, so the same priorities settle it.
func TestOrderAgainstIptablesLegacy(t *testing.T) { testOrderAgainst(t, "legacy") }

func testOrderAgainst(t *testing.T, variant string) {
	forEach(t, func(t *testing.T, p *pod) {
		ipt, peer, routed := "iptables-"+variant, p.a.Peer.String(), "10.98.0.0/24"
		if p.v.v6 {
			ipt, peer, routed = "ip6tables-"+variant, "["+p.a.Peer.String()+"]", "fd00:98::/64"
		}
		iptablesIn(t, p.Pod, "", ipt, "-t", "mangle", "-A", "PREROUTING", "-p", "tcp", "-d", routed, "-j", "MARK", "--set-xmark", "0x0/0xfff")
		rs := p.enrol(t, p.spec())
		iptablesIn(t, p.Pod, "", ipt, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", p.a.Peer.String(), "--dport", fmt.Sprint(serverPort),
			"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", peer, serverExcluded))

		out := p.to(p.a.Peer, serverPort)
		p.wantOutbound(t, p.expect(t, p.Pod, out, nstest.ProxyOutbound), nstest.ProxyOutbound, out.To)
		if p.v.mode == nft.ModeTProxy {
			// Only the tproxy mark and table 100 deliver an address the
			// pod does not own; a mark cleared after ours loses it.
			in := p.to(p.a.Routed, appPort)
			wantInbound(t, p.v.mode, p.expect(t, p.Peer, in, nstest.ProxyInbound), in.To)
		}
		if st, text := p.verify(t, rs); st != nft.StatusInSync {
			t.Errorf("our table is %v:\n%s", st, text)
		}
		rules := p.Pod.Run(t, ipt+"-save")
		for _, want := range []string{"-j DNAT", "-j MARK"} {
			if !strings.Contains(rules, want) {
				t.Errorf("%s's rule %q is gone:\n%s", ipt, want, rules)
			}
		}
	})
}
