package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// procKB reads a "Vm..." line of /proc/PID/status, in KiB.
func procKB(b *testing.B, pid int, field string) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return v
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// resetPeak restarts VmHWM from the current RSS.
func resetPeak(b *testing.B, pid int) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
}

// hugeHeaders sends one request whose header block is size bytes, the
// way a hostile local caller would, and waits for the daemon to end it.
func hugeHeaders(socket string, size int) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	enc.WriteField(hpack.HeaderField{Name: ":path", Value: "/nftredir.v1.RedirectService/ListPods"})
	enc.WriteField(hpack.HeaderField{Name: "x-padding", Value: strings.Repeat("a", size)})
	const frame = 16 << 10
	p := block.Bytes()
	if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p[:frame]}) != nil {
		return
	}
	for p = p[frame:]; len(p) > 0; {
		n := min(frame, len(p))
		if fr.WriteContinuation(1, n == len(p), p[:n]) != nil {
			return
		}
		p = p[n:]
	}
	io.Copy(io.Discard, c)
}

// BenchmarkHostileCallersMemory measures the daemon's resident memory
// (a separate process, /proc/PID/status) against the two floods a hostile
// local caller can send: 20 concurrent 15 MiB header blocks, and 1,000
// WatchPods streams that never read, each on its own connection, then
// after those close. Run it once: -bench HostileCallers -benchtime 1x.
func BenchmarkHostileCallersMemory(b *testing.B) {
	nstest.RequirePrivileged(b)
	for range b.N {
		dir := b.TempDir()
		socket := filepath.Join(dir, "run", "nftredir.sock")
		d := startDaemon(b, "--socket", socket, "--state-dir", filepath.Join(dir, "pods"), "--log-level", "error",
			"--probe-snat=false", "--zds-socket=")
		waitServing(b, socket)
		pid := d.cmd.Process.Pid
		base := procKB(b, pid, "VmRSS")

		resetPeak(b, pid)
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { hugeHeaders(socket, 15<<20) })
		}
		wg.Wait()
		headersPeak := procKB(b, pid, "VmHWM")

		resetPeak(b, pid)
		var conns []*grpc.ClientConn
		var cancels []context.CancelFunc
		served := 0
		for range 1000 {
			conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			w, err := nftredirv1.NewRedirectServiceClient(conn).WatchPods(ctx, &nftredirv1.WatchPodsRequest{})
			if err == nil {
				if _, err = w.Recv(); err == nil {
					served++
				}
			}
			conns = append(conns, conn)
			cancels = append(cancels, cancel)
		}
		watchersPeak := procKB(b, pid, "VmHWM")
		for i := range conns {
			cancels[i]()
			conns[i].Close()
		}
		time.Sleep(5 * time.Second)
		after := procKB(b, pid, "VmRSS")

		b.ReportMetric(base/1024, "MiB-base")
		b.ReportMetric(headersPeak/1024, "MiB-peak-headers")
		b.ReportMetric(watchersPeak/1024, "MiB-peak-watchers")
		b.ReportMetric(after/1024, "MiB-5s-after-close")
		b.ReportMetric(float64(served), "watchers-served")
	}
}
