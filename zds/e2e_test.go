package zds_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/standin"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/zds"
)

// proxyMark is the mark ztunnel puts on its in-pod sockets.
const proxyMark = defaults.ProxyMark

// listenInNetns opens the proxy's listeners inside the namespace behind
// fd, the way ztunnel does with the fd it receives over ZDS: on a locked
// thread that enters the namespace, creates the sockets and comes back.
func listenInNetns(fd int, ports map[string]uint16) (map[string]net.Listener, error) {
	type result struct {
		ls  map[string]net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer orig.Close()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("setns to the received fd: %w", err)}
			return
		}
		ls := map[string]net.Listener{}
		lc := standin.ListenConfig(proxyMark)
		for name, port := range ports {
			l, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", port))
			if err != nil {
				for _, l := range ls {
					l.Close()
				}
				ls, err = nil, fmt.Errorf("listen %s: %w", name, err)
				done <- result{err: errors.Join(err, vnetns.Set(orig))}
				return
			}
			ls[name] = l
		}
		if err := vnetns.Set(orig); err != nil {
			// Still locked: the thread dies with the goroutine.
			done <- result{ls: ls, err: fmt.Errorf("leave the pod namespace: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		done <- result{ls: ls}
	}()
	r := <-done
	return r.ls, r.err
}

// serveProxy answers each connection with the listener's name and where
// the connection was going.
func serveProxy(t *testing.T, ls map[string]net.Listener) {
	var wg sync.WaitGroup
	for name, l := range ls {
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				wg.Go(func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(nstest.DefaultTimeout))
					if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
						return
					}
					dst, _, _ := standin.OriginalDst(c.(*net.TCPConn))
					fmt.Fprintf(c, "%s %s\n", name, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
				})
			}
		})
	}
	t.Cleanup(func() {
		for _, l := range ls {
			l.Close()
		}
		wg.Wait()
	})
}

// ask connects from inside ns and returns the answer line.
func ask(t *testing.T, ns *nstest.Netns, to netip.AddrPort) string {
	t.Helper()
	var line string
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", to.String(), nstest.DefaultTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(nstest.DefaultTimeout))
		if _, err := c.Write([]byte("hi\n")); err != nil {
			return err
		}
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	if err != nil {
		t.Fatalf("connect to %s from %s: %v", to, ns.Name, err)
	}
	return strings.TrimSpace(line)
}

// TestStandInProxyEndToEnd: a stand-in for ztunnel gets the pod's
// namespace over ZDS only, opens its listeners in it through the received
// fd, and real TCP into and out of the captured pod lands on them.
func TestStandInProxyEndToEnd(t *testing.T) {
	f := newKernelFixture(t, nil)
	pair := nstest.NewPair(t)
	pod, client := pair.Pod, pair.Peer
	const uid = "0b6f3c1e-pod"
	// The app: an uncaptured connection would get its answer instead.
	nstest.StartTCP(t, pod, nstest.NewRecorder(), "app", 8080)

	// The pod's capture, as AddPod programs it.
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	h, err := g.Open(pod.Path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netns.EnsureRouting(h, netns.DefaultRouting()); err != nil {
		t.Fatal(err)
	}
	rs, err := nft.Build(nft.DefaultSpec(uid))
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
		t.Fatal(err)
	}
	f.src.put(podFor(uid, h))
	h.Close()

	p := zdstest.Dial(t, f.path)
	p.Hello()
	add := p.Expect(zdstest.Add, uid)
	ls, err := listenInNetns(add.Fds[0], map[string]uint16{"proxy-inbound": defaults.InboundPort, "proxy-outbound": defaults.OutboundPort, "proxy-hbone": defaults.HBONEPort})
	if err != nil {
		p.Ack("failure to start proxy: " + err.Error())
		t.Fatal(err)
	}
	serveProxy(t, ls)
	p.Ack("")
	p.Expect(zdstest.SnapshotSent, "")
	p.Ack("")

	families := []bool{false}
	if nstest.HaveIPv6() {
		families = append(families, true)
	}
	for _, v6 := range families {
		a := nstest.Family(v6)
		inbound := netip.AddrPortFrom(a.Pod, 8080)
		if got, want := ask(t, client, inbound), "proxy-inbound "+inbound.String(); got != want {
			t.Errorf("inbound to %s: %q, want %q", inbound, got, want)
		}
		hbone := netip.AddrPortFrom(a.Pod, defaults.HBONEPort)
		if got, want := ask(t, client, hbone), "proxy-hbone "+hbone.String(); got != want {
			t.Errorf("inbound to %s: %q, want %q", hbone, got, want)
		}
		outbound := netip.AddrPortFrom(a.Peer, 9090)
		if got, want := ask(t, pod, outbound), "proxy-outbound "+outbound.String(); got != want {
			t.Errorf("outbound to %s: %q, want %q", outbound, got, want)
		}
	}
}

func podFor(uid string, h *netns.Handle) zds.Pod {
	return zds.Pod{UID: uid, Name: "app", Namespace: "shop", ServiceAccount: "app", NetnsPath: h.Path(), NetnsID: h.ID()}
}
