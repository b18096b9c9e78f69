package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/podevents"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// rawHTTP2 opens a connection to the server's socket and speaks HTTP/2
// by hand, so a test can send what no gRPC client would.
func rawHTTP2(t *testing.T, socket string) (net.Conn, *http2.Framer) {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c, fr
}

// sendHeaders sends one request header block for method, with an extra
// header of valueLen bytes, split into frames as large as HTTP/2 allows
// by default.
func sendHeaders(t *testing.T, fr *http2.Framer, method string, valueLen int) {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: method},
		{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "x-padding", Value: strings.Repeat("a", valueLen)},
	} {
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	const frame = 16 << 10
	b := block.Bytes()
	first := b[:min(frame, len(b))]
	b = b[len(first):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndStream: true, EndHeaders: len(b) == 0}); err != nil {
		t.Fatal(err)
	}
	for len(b) > 0 {
		n := min(frame, len(b))
		if err := fr.WriteContinuation(1, n == len(b), b[:n]); err != nil {
			if errors.Is(err, io.ErrClosedPipe) || errors.Is(err, net.ErrClosed) {
				return // refused mid-block
			}
			return
		}
		b = b[n:]
	}
}

// answer reads frames until the server answers stream 1 with headers
// ("answered"), resets it or the connection ("refused"), or closes.
func answer(fr *http2.Framer) string {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "refused"
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamID == 1 {
				return "answered"
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return "refused"
			}
		case *http2.GoAwayFrame:
			return "refused"
		}
	}
}

// TestOversizedHeaderBlockIsRefused: a header block over the limit is
// refused before any handler or auth check runs, and one within it is
// served, so the limit is what refuses.
func TestOversizedHeaderBlockIsRefused(t *testing.T) {
	ts := startServer(t, true)
	for _, tc := range []struct {
		size int
		want string
	}{
		{1 << 10, "answered"},
		{MaxHeaderListSize + 1, "refused"},
		{1 << 20, "refused"},
	} {
		_, fr := rawHTTP2(t, ts.socket)
		sendHeaders(t, fr, "/grpc.health.v1.Health/Check", tc.size)
		if got := answer(fr); got != tc.want {
			t.Errorf("header block with a %d-byte value: %s, want %s", tc.size, got, tc.want)
		}
	}
	// The server is unharmed.
	ts.waitServing(t)
}

// dialAs connects to socket with the given uid and gid as SO_PEERCRED
// records them: the connect(2) runs on a locked thread whose credentials
// alone are switched (raw setresuid, which Go would otherwise apply to
// every thread) and switched back. A thread that cannot switch back is
// left locked, so the runtime discards it.
func dialAs(socket string, uid, gid int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), 0); e != 0 {
			unix.Close(fd)
			ch <- result{nil, fmt.Errorf("setresgid: %w", e)}
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), 0); e != 0 {
			unix.Close(fd)
			ch <- result{nil, fmt.Errorf("setresuid: %w", e)}
			return
		}
		cerr := unix.Connect(fd, &unix.SockaddrUnix{Name: socket})
		_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, 0)
		_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, 0, 0, 0)
		if e1 == 0 && e2 == 0 {
			runtime.UnlockOSThread()
		}
		if cerr != nil {
			unix.Close(fd)
			ch <- result{nil, cerr}
			return
		}
		f := os.NewFile(uintptr(fd), "unix:"+socket)
		c, err := net.FileConn(f)
		f.Close()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

const nobody = 65534

// openToOthers lets other uids reach the test server's socket.
func (ts *testServer) openToOthers(t *testing.T) {
	t.Helper()
	for _, p := range []string{filepath.Dir(ts.dir), ts.dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(ts.socket, 0o666); err != nil {
		t.Fatal(err)
	}
}

// settled polls cond, for counts that follow a close or an accept on
// the server's goroutines; the bound only guards against a hang.
func settled(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// handshake reports whether the server speaks HTTP/2 on c (sends its
// SETTINGS) or closes it.
func handshake(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return false
	}
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	_, err := fr.ReadFrame()
	return err == nil
}

// TestConnectionLimits: connections over the per-uid or the total limit
// are closed at accept, whoever the caller (here a uid that may not even
// call the API), and the slots come back when connections close.
func TestConnectionLimits(t *testing.T) {
	nstest.RequirePrivileged(t) // dialAs switches uid
	ts := startServer(t, true, func(c *testConfig) { c.Limits = Limits{MaxConnections: 5, MaxConnectionsPerUID: 3} })
	ts.openToOthers(t)
	base := ts.srv.conns.count() // the test's own client
	var theirs []net.Conn
	for i := range 4 {
		c, err := dialAs(ts.socket, nobody, nobody)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, want := handshake(t, c), i < 3; got != want {
			t.Fatalf("uid %d connection %d: served %v, want %v", nobody, i+1, got, want)
		}
		theirs = append(theirs, c)
	}
	settled(t, "count after the refusal", func() bool { return ts.srv.conns.count() == base+3 })
	// Root has its own share, up to the total (below its own share).
	for i := base + 3; i < 6; i++ {
		c, err := net.Dial("unix", ts.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, want := handshake(t, c), i < 5; got != want {
			t.Fatalf("root connection with %d open: served %v, want %v", i, got, want)
		}
	}
	if !strings.Contains(ts.logs.String(), "connection refused: too many open connections") {
		t.Error("refusals are not logged")
	}
	for _, c := range theirs {
		c.Close()
	}
	settled(t, "slots given back", func() bool { return ts.srv.conns.count() == base+1 })
	c, err := dialAs(ts.socket, nobody, nobody)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !handshake(t, c) {
		t.Error("a connection after others closed was refused")
	}
}

// clientAs is a gRPC client whose connections carry uid's credentials.
func (ts *testServer) clientAs(t *testing.T, uid int, opts ...grpc.DialOption) nftredirv1.RedirectServiceClient {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return dialAs(ts.socket, uid, uid) }),
	}, opts...)
	conn, err := grpc.NewClient("passthrough:///nftredir", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return nftredirv1.NewRedirectServiceClient(conn)
}

// watch opens WatchPods and reads its snapshot; the error is the
// status the watch failed with, if it did.
func watch(t *testing.T, api nftredirv1.RedirectServiceClient) (context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	w, err := api.WatchPods(ctx, &nftredirv1.WatchPodsRequest{})
	for err == nil {
		var m *nftredirv1.WatchPodsResponse
		if m, err = w.Recv(); err == nil && m.Event == nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE {
			return cancel, nil
		}
	}
	cancel()
	return nil, err
}

// TestWatcherLimits: WatchPods streams over the per-uid or the total
// limit fail with ResourceExhausted, and slots come back when watches end.
func TestWatcherLimits(t *testing.T) {
	nstest.RequirePrivileged(t) // clientAs switches uid
	ts := startServer(t, true, func(c *testConfig) {
		c.Limits = Limits{MaxWatchers: 4, MaxWatchersPerUID: 2}
		c.AllowUIDs = []uint32{nobody}
	})
	ts.openToOthers(t)
	theirs := ts.clientAs(t, nobody)
	var cancels []context.CancelFunc
	for i := range 3 {
		cancel, err := watch(t, theirs)
		if i < 2 && err != nil {
			t.Fatalf("uid %d watch %d: %v", nobody, i+1, err)
		}
		if i == 2 {
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "per caller uid") {
				t.Fatalf("uid %d watch 3: %v, want ResourceExhausted for the per-uid limit", nobody, err)
			}
			break
		}
		cancels = append(cancels, cancel)
	}
	for i := range 3 {
		cancel, err := watch(t, ts.api)
		if i < 2 && err != nil {
			t.Fatalf("root watch %d: %v", i+1, err)
		}
		if i == 2 {
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "daemon's limit of 4") {
				t.Fatalf("root watch 3: %v, want ResourceExhausted for the total limit", err)
			}
			break
		}
		defer cancel()
	}
	if n := ts.srv.watchers.count(); n != 4 {
		t.Errorf("%d watchers counted, want 4", n)
	}
	for _, c := range cancels {
		c()
	}
	settled(t, "watch slots given back", func() bool { return ts.srv.watchers.count() == 2 })
	cancel, err := watch(t, theirs)
	if err != nil {
		t.Fatalf("watch after others ended: %v", err)
	}
	cancel()
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// TestSlowWatcherIsCutOffAndFreed: a watcher whose peer holds the
// connection open but never reads is ended once it falls behind, its
// goroutines gone, instead of holding them (and the events queued for
// it) until the peer leaves.
func TestSlowWatcherIsCutOffAndFreed(t *testing.T) {
	ts := startServer(t, true)
	// A fixed client window: the client's transport stops reading the
	// stream at 64 KiB, so the daemon's Send blocks soon.
	conn, err := grpc.NewClient("unix://"+ts.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	slow := nftredirv1.NewRedirectServiceClient(conn)
	// No deadline: the peer must outlast the wait below.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := slow.WatchPods(ctx, &nftredirv1.WatchPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := w.Recv(); err != nil || m.Event != nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE {
		t.Fatalf("snapshot: %v, %v", m, err)
	}
	const handler = "server.(*Server).WatchPods"
	settled(t, "watch handler running", func() bool { return goroutinesIn(handler) == 1 })
	// Events big enough to fill the windows, then the queue, at once.
	big := &nftredirv1.Pod{PodUid: "big", PodName: strings.Repeat("n", 32<<10)}
	for range podevents.Buffer + 16 {
		ts.pods.Events().Publish(nftredirv1.EventType_EVENT_TYPE_ADDED, big)
	}
	settled(t, "slow watcher's goroutines gone while its peer still holds the stream", func() bool {
		return goroutinesIn(handler) == 0 && goroutinesIn("podevents.(*Hub)") == 0
	})
	if n := ts.srv.watchers.count(); n != 0 {
		t.Errorf("%d watchers still counted", n)
	}
}
