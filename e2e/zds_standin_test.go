package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/standin"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
)

// zdsStandin plays ztunnel's part on the node for the tests that run no
// ztunnel. Connected to the node agent's ZDS socket, it opens the
// stand-in proxy's TCP listeners (nstest's outbound, inbound and HBONE
// names, on the default ports, transparent and carrying the proxy mark)
// in every namespace it is handed, before it acks; it closes them on a
// DelWorkload, or when a snapshot leaves their pod out. As ztunnel does,
// it keeps serving while the agent is gone and dials again every 100 ms,
// and a pod the new agent's snapshot hands it again in the same namespace
// keeps its listeners: so connections to the pods it serves depend on the
// agent only through what it is sent.
type zdsStandin struct {
	path  string
	ports nstest.ProxyPorts

	mu sync.Mutex
	// protects the following fields
	pods      map[string]*standinPod
	conns     int
	snapshots []int
	problems  []string
}

// standinPod is one pod's namespace and the listeners open in it.
type standinPod struct {
	dev, ino uint64
	ls       []net.Listener
}

func (p *standinPod) close() {
	for _, l := range p.ls {
		l.Close()
	}
}

// startZDSStandin serves the agent's socket at path until the test ends.
func startZDSStandin(t *testing.T, path string) *zdsStandin {
	t.Helper()
	z := &zdsStandin{path: path, ports: nstest.DefaultProxyPorts, pods: map[string]*standinPod{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if peer, err := zdstest.Connect(t, path); err == nil {
				z.serve(ctx, peer)
				peer.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		z.mu.Lock()
		defer z.mu.Unlock()
		for _, p := range z.pods {
			p.close()
		}
		if t.Failed() && len(z.problems) > 0 {
			t.Logf("the ZDS stand-in proxy's problems: %q", z.problems)
		}
	})
	return z
}

// serve answers one connection of the agent until it closes.
func (z *zdsStandin) serve(ctx context.Context, peer *zdstest.Peer) {
	if err := peer.Write(zdstest.HelloMsg(1)); err != nil {
		return
	}
	z.mu.Lock()
	z.conns++
	z.mu.Unlock()
	// The pods handed over on this connection, for its snapshot's end.
	seen := map[string]bool{}
	for ctx.Err() == nil {
		req, err := peer.Recv(time.Second)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return
		}
		nack := z.handle(req, seen)
		zdstest.CloseFds(req)
		if err := peer.Write(zdstest.AckMsg(nack)); err != nil {
			return
		}
	}
}

// handle does what one request asks and returns the ack's error, "" for
// success.
func (z *zdsStandin) handle(req zdstest.Request, seen map[string]bool) string {
	z.mu.Lock()
	defer z.mu.Unlock()
	switch req.Kind {
	case zdstest.Add:
		seen[req.UID] = true
		if len(req.Fds) != 1 {
			return z.problem("add %s came with %d fds", req.UID, len(req.Fds))
		}
		var st unix.Stat_t
		if err := unix.Fstat(req.Fds[0], &st); err != nil {
			return z.problem("add %s: fstat: %v", req.UID, err)
		}
		if p := z.pods[req.UID]; p != nil {
			if p.dev == st.Dev && p.ino == st.Ino {
				return ""
			}
			p.close()
			delete(z.pods, req.UID)
		}
		ls, err := z.listen(req.Fds[0])
		if err != nil {
			return z.problem("add %s: %v", req.UID, err)
		}
		z.pods[req.UID] = &standinPod{dev: st.Dev, ino: st.Ino, ls: ls}
	case zdstest.Keep:
		seen[req.UID] = true
	case zdstest.Del:
		if p := z.pods[req.UID]; p != nil {
			p.close()
			delete(z.pods, req.UID)
		}
	case zdstest.SnapshotSent:
		for uid, p := range z.pods {
			if !seen[uid] {
				p.close()
				delete(z.pods, uid)
			}
		}
		z.snapshots = append(z.snapshots, len(seen))
	}
	return ""
}

func (z *zdsStandin) problem(format string, args ...any) string {
	msg := fmt.Sprintf(format, args...)
	z.problems = append(z.problems, msg)
	return msg
}

// listen opens the listeners in the namespace of fd, each answering every
// connection with its name after reading one line, as nstest's proxy.
func (z *zdsStandin) listen(fd int) ([]net.Listener, error) {
	ns := &nstest.Netns{Name: fmt.Sprintf("fd %d", fd), Path: fmt.Sprintf("/proc/self/fd/%d", fd)}
	var all []net.Listener
	names := map[net.Listener]string{}
	err := ns.Do(func() error {
		for _, l := range []struct {
			name string
			port uint16
		}{{nstest.ProxyOutbound, z.ports.Outbound}, {nstest.ProxyInbound, z.ports.Inbound}, {nstest.ProxyHBONE, z.ports.HBONE}} {
			ls, err := standin.ListenBoth(context.Background(), standin.ListenConfig(z.ports.Mark), l.port)
			if err != nil {
				return fmt.Errorf("listen %s on :%d: %w", l.name, l.port, err)
			}
			for _, one := range ls {
				names[one] = l.name
			}
			all = append(all, ls...)
		}
		return nil
	})
	if err != nil {
		for _, l := range all {
			l.Close()
		}
		return nil, err
	}
	for _, l := range all {
		go answerWithName(l, names[l])
	}
	return all, nil
}

func answerWithName(l net.Listener, name string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				return
			}
			fmt.Fprintln(c, name)
		}()
	}
}

// serves reports whether the stand-in has listeners open for the pod.
func (z *zdsStandin) serves(uid string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.pods[uid] != nil
}

// waitServes waits until the stand-in serves the pod.
func (z *zdsStandin) waitServes(t *testing.T, uid string) {
	t.Helper()
	waitUntil(t, "the ZDS stand-in proxy to serve pod "+uid, followTimeout, func() bool { return z.serves(uid) })
}

// String sums up what the stand-in did, for the test log.
func (z *zdsStandin) String() string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return fmt.Sprintf("%d connections to the agent, snapshots of %v pods, serving %d pods, %d problems", z.conns, z.snapshots, len(z.pods), len(z.problems))
}

// problemList is what went wrong in the stand-in (nacked adds).
func (z *zdsStandin) problemList() []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return append([]string(nil), z.problems...)
}
