package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	vnetns "github.com/vishvananda/netns"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/standin"
)

// Data-path methods: the same pod, captured by nftredir's ruleset or by
// the peer's, and a reference without capture.
const (
	dpNftredir = "nftredir ruleset (TPROXY)"
	dpPeer     = "iptables ruleset (TPROXY)"
	dpNone     = "no capture (reference)"
)

// Addresses of the data-path topology. They exist only inside the two
// namespaces each sample creates.
const (
	dpPodAddr    = "10.99.0.2"
	dpClientAddr = "10.99.0.1"
	dpAppPort    = 8080                 // where the client connects
	dpProxyPort  = defaults.InboundPort // where capture delivers it
	dpProxyMark  = defaults.ProxyMark
)

// clientPorts is the client namespace's ephemeral port range. A sample
// (warm-up included) must stay below its size: a port used twice within
// the TIME_WAIT period would make the kernel recycle a connection, which
// is not what is being measured.
var clientPorts = [2]int{1024, 65535}

const dpWarmup = 200

// dataPathSample builds a client namespace and a pod namespace joined by
// a veth pair, programs the pod by method, puts a transparent listener in
// the pod as the proxy, and runs conc clients that each connect, exchange
// one byte and close, as fast as they can, until the sample's time or
// connection budget is spent.
func (b *bench) dataPathSample(ctx context.Context, d *daemon, method string, conc, rep int) (*sample, error) {
	names, err := b.pool.create(2, "d")
	if err != nil {
		return nil, err
	}
	defer b.pool.remove(names)
	pod, cli := names[0], names[1]
	if err := ipBatch(pod, fmt.Sprintf("link add eth0 type veth peer name eth0 netns %s\naddr add %s/24 dev eth0\nlink set eth0 up\n", cli, dpPodAddr)); err != nil {
		return nil, err
	}
	if err := ipBatch(cli, fmt.Sprintf("addr add %s/24 dev eth0\nlink set eth0 up\n", dpClientAddr)); err != nil {
		return nil, err
	}
	if err := inNetns(cli, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(fmt.Sprintf("%d %d", clientPorts[0], clientPorts[1])), 0o644)
	}); err != nil {
		return nil, fmt.Errorf("client port range: %w", err)
	}
	listenPort := dpProxyPort
	switch method {
	case dpNftredir:
		uid := "dp-" + pod[len(b.pool.prefix):]
		if _, err := d.client.AddPod(ctx, addRequest(uid, pod, dpPodAddr)); err != nil {
			return nil, err
		}
		defer d.client.RemovePod(context.Background(), uid)
	case dpPeer:
		for _, st := range iptablesSteps(pod) {
			if err := st.run(); err != nil {
				return nil, err
			}
		}
	case dpNone:
		listenPort = dpAppPort
	}

	var ln net.Listener
	err = inNetns(pod, func() error {
		lc := standin.ListenConfig(dpProxyMark)
		var err error
		ln, err = lc.Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", listenPort))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("proxy listener in %s: %w", pod, err)
	}
	var misrouted atomic.Int64
	var handlers sync.WaitGroup
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// The accepted socket's local address is the original
			// destination under TPROXY: proof the connection was captured
			// rather than delivered some other way.
			if c.LocalAddr().(*net.TCPAddr).Port != dpAppPort {
				misrouted.Add(1)
			}
			handlers.Go(func() { echoOne(c) })
		}
	}()
	defer func() {
		ln.Close()
		<-acceptDone
		handlers.Wait()
	}()

	target := fmt.Sprintf("%s:%d", dpPodAddr, dpAppPort)
	// Warm up ARP, conntrack and the allocator before timing.
	if _, err := b.connectLoop(ctx, cli, target, 1, dpWarmup, time.Minute); err != nil {
		return nil, fmt.Errorf("%s: warm-up: %w", method, err)
	}
	s := &sample{method: method, rep: rep, conc: conc, load: loadAvg()}
	c0 := selfAndChildrenCPU()
	t0 := time.Now()
	s.lat, err = b.connectLoop(ctx, cli, target, conc, b.cfg.dpConns, b.cfg.dpDuration)
	s.wall = time.Since(t0)
	s.cpu = selfAndChildrenCPU() - c0
	if err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	if n := misrouted.Load(); n > 0 {
		return nil, fmt.Errorf("%s: %d connections reached the proxy without their original destination", method, n)
	}
	return s, nil
}

// echoOne answers one byte with one byte and waits for the client to go.
func echoOne(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var buf [1]byte
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		return
	}
	if _, err := c.Write(buf[:]); err != nil {
		return
	}
	c.Read(buf[:])
}

// connectLoop runs conc clients in namespace ns until limit connections
// are done or budget has passed, and returns each connection's latency:
// connect, one byte each way, close.
func (b *bench) connectLoop(ctx context.Context, ns, target string, conc, limit int, budget time.Duration) ([]time.Duration, error) {
	var started atomic.Int64
	deadline := time.Now().Add(budget)
	lats := make([][]time.Duration, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			errs[w] = inNetns(ns, func() error {
				d := net.Dialer{Timeout: 5 * time.Second}
				var buf [1]byte
				for started.Add(1) <= int64(limit) && time.Now().Before(deadline) && ctx.Err() == nil {
					t := time.Now()
					c, err := d.DialContext(ctx, "tcp4", target)
					if err != nil {
						return err
					}
					tc := c.(*net.TCPConn)
					tc.SetDeadline(time.Now().Add(5 * time.Second))
					_, err = tc.Write([]byte{1})
					if err == nil {
						_, err = io.ReadFull(tc, buf[:])
					}
					// A plain close: the client keeps TIME_WAIT, so no
					// port is reused within a sample and every SYN is a
					// new connection to conntrack (see clientPorts).
					tc.Close()
					if err != nil {
						return err
					}
					lats[w] = append(lats[w], time.Since(t))
				}
				return nil
			})
		})
	}
	wg.Wait()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	if err := errors.Join(errs...); err != nil {
		return all, err
	}
	return all, ctx.Err()
}

// inNetns runs fn on a fresh OS thread inside namespace name, so the
// sockets fn creates belong to it (they keep it afterwards, wherever they
// are used). The thread returns to our namespace before it is released;
// if it cannot, it is left locked and the runtime retires it.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := vnetns.GetFromPath(nsPath(name))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", name, err)
			return
		}
		fnErr := fn()
		if err := vnetns.Set(orig); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("leave %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}
