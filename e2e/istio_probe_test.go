package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// Source ports the probes bind, below every pod's ephemeral range
// (checkBelowEphemeral): a connection ztunnel opens to the app comes from
// an ephemeral port of the server's namespace, so the app seeing the
// probe's own address and port means nothing stood between them.
const (
	probePortBase  = 20000
	probePortCount = 10000
)

// probePortSeq hands out the probes' source ports in turn, so no probe
// meets a previous one's TIME_WAIT.
var probePortSeq atomic.Uint32

func nextProbePort() uint16 {
	return uint16(probePortBase + probePortSeq.Add(1)%probePortCount)
}

// checkBelowEphemeral fails unless ns's ephemeral port range starts above
// the probes' source ports.
func checkBelowEphemeral(t *testing.T, ns *nstest.Netns) string {
	t.Helper()
	var raw []byte
	if err := ns.Do(func() (err error) {
		raw, err = os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(raw), &lo, &hi); err != nil {
		t.Fatalf("ip_local_port_range %q: %v", raw, err)
	}
	if lo < probePortBase+probePortCount {
		t.Fatalf("%s: ephemeral ports %d-%d overlap the probes' source ports %d-%d", ns.Name, lo, hi, probePortBase, probePortBase+probePortCount-1)
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

// try is one probe: a TCP connection from a pod, as its app would open
// it, to an app that names the peer it saw.
type try struct {
	at     time.Time
	local  netip.AddrPort
	answer string
	err    error
}

// peer is the address the app says the connection came from.
func (r try) peer() string {
	_, after, ok := strings.Cut(r.answer, "  from ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(after)
}

// answeredBy reports whether app answered.
func (r try) answeredBy(app string) bool {
	return r.err == nil && strings.HasPrefix(r.answer, "answered directly by "+app+" ")
}

// direct reports whether the app saw the probe's own address and port:
// the connection reached it without passing a proxy.
func (r try) direct() bool {
	return r.answer != "" && r.peer() == r.local.String()
}

func (r try) String() string {
	if r.err != nil {
		return fmt.Sprintf("%s -> error %v", r.local, r.err)
	}
	return fmt.Sprintf("%s -> %q", r.local, r.answer)
}

// probeOnce connects from ns, bound to src and the next probe port, to to,
// and reads the first line of the answer.
func probeOnce(ns *nstest.Netns, src netip.Addr, to string, timeout time.Duration) try {
	r := try{at: time.Now(), local: netip.AddrPortFrom(src, nextProbePort())}
	r.err = ns.Do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: net.TCPAddrFromAddrPort(r.local)}
		c, err := d.Dial("tcp", to)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		fmt.Fprintln(c, "probe")
		line, err := bufio.NewReader(c).ReadString('\n')
		r.answer = strings.TrimSpace(line)
		return err
	})
	return r
}

// prober probes every interval until stopped, keeping every try.
type prober struct {
	name string
	stop func()
	mu   sync.Mutex
	all  []try
}

func startProber(t *testing.T, name string, ns *nstest.Netns, src netip.Addr, to string, every time.Duration) *prober {
	t.Helper()
	p := &prober{name: name}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			r := probeOnce(ns, src, to, time.Second)
			p.mu.Lock()
			p.all = append(p.all, r)
			p.mu.Unlock()
			select {
			case <-quit:
				return
			case <-time.After(every):
			}
		}
	}()
	var once sync.Once
	p.stop = func() { once.Do(func() { close(quit); <-done }) }
	t.Cleanup(p.stop)
	return p
}

// tries returns the tries started in [from, to).
func (p *prober) tries(from, to time.Time) []try {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []try
	for _, r := range p.all {
		if !r.at.Before(from) && r.at.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// waitRun waits until the last n tries, all started after since, satisfy
// ok.
func (p *prober) waitRun(t *testing.T, since time.Time, n int, timeout time.Duration, ok func(try) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		run := 0
		for i := len(p.all) - 1; i >= 0 && !p.all[i].at.Before(since) && ok(p.all[i]); i-- {
			run++
		}
		var last try
		if len(p.all) > 0 {
			last = p.all[len(p.all)-1]
		}
		p.mu.Unlock()
		if run >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %d good tries in a row within %s; last: %v", p.name, n, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// phase sums up tries: how many, how many failed, the longest run of
// failures in a row (and how long it lasted), and the tries that must
// never happen (bad).
type phase struct {
	tries, failed, run int
	runSpan            time.Duration
	bad                []try
}

func summarize(rs []try, ok, bad func(try) bool) phase {
	var ph phase
	run := 0
	var runStart time.Time
	for _, r := range rs {
		ph.tries++
		if bad(r) {
			ph.bad = append(ph.bad, r)
		}
		if ok(r) {
			run = 0
			continue
		}
		ph.failed++
		if run == 0 {
			runStart = r.at
		}
		run++
		if run > ph.run {
			ph.run, ph.runSpan = run, r.at.Sub(runStart)+100*time.Millisecond
		}
	}
	return ph
}

func (ph phase) String() string {
	return fmt.Sprintf("%d tries, %d failed, at most %d in a row (%s), %d direct", ph.tries, ph.failed, ph.run, ph.runSpan.Round(10*time.Millisecond), len(ph.bad))
}

// nodeResolver is a DNS server on the node's IP, port 53 (UDP), that
// answers every A query with one address and counts the queries per
// source address: a pod's resolver that is not ztunnel.
type nodeResolver struct {
	addr   netip.AddrPort
	answer netip.Addr
	mu     sync.Mutex
	from   map[netip.Addr]int
}

func startNodeResolver(t *testing.T, c *kcluster.Cluster, answer netip.Addr) *nodeResolver {
	t.Helper()
	r := &nodeResolver{addr: netip.AddrPortFrom(c.NodeIP, 53), answer: answer, from: map[netip.Addr]int{}}
	var conn *net.UDPConn
	if err := c.Netns.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(r.addr))
		return err
	}); err != nil {
		t.Fatalf("DNS server on the node at %s: %v", r.addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, src, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			r.mu.Lock()
			r.from[src.Addr().Unmap()]++
			r.mu.Unlock()
			m.Header.Response, m.Header.Authoritative = true, true
			if q := m.Questions[0]; q.Type == dnsmessage.TypeA {
				m.Answers = []dnsmessage.Resource{{
					Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
					Body:   &dnsmessage.AResource{A: r.answer.As4()},
				}}
			}
			if out, err := m.Pack(); err == nil {
				conn.WriteToUDPAddrPort(out, src)
			}
		}
	}()
	return r
}

func (r *nodeResolver) queriesFrom(a netip.Addr) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.from[a]
}

// queryA sends one DNS A query over UDP from ns to server, as the pod's
// resolver library would, and returns the addresses of the answer.
func queryA(ns *nstest.Netns, server netip.AddrPort, name string) ([]netip.Addr, error) {
	q := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: uint16(time.Now().UnixNano()), RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	wire, err := q.Pack()
	if err != nil {
		return nil, err
	}
	var resp []byte
	err = ns.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(server))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write(wire); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		resp = buf[:n]
		return err
	})
	if err != nil {
		return nil, err
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		return nil, err
	}
	if m.Header.ID != q.Header.ID || m.Header.RCode != dnsmessage.RCodeSuccess {
		return nil, fmt.Errorf("answer id %d rcode %v", m.Header.ID, m.Header.RCode)
	}
	var out []netip.Addr
	for _, a := range m.Answers {
		if ar, ok := a.Body.(*dnsmessage.AResource); ok {
			out = append(out, netip.AddrFrom4(ar.A))
		}
	}
	return out, nil
}
