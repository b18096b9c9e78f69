package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// httpAddr is the address the daemon logged for its HTTP endpoints.
func (d *nftredird) httpAddr(t *testing.T) string {
	t.Helper()
	lines := d.logEntries(t, "serving health and metrics")
	if len(lines) == 0 {
		t.Fatal("the daemon logged no HTTP address")
	}
	addr, _ := lines[len(lines)-1]["address"].(string)
	return addr
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// scrape parses /metrics as Prometheus does.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// sample finds the metric of family name whose labels include want.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

func counter(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	m := sample(fams, name, labels)
	if m == nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func gauge(fams map[string]*dto.MetricFamily, name string) float64 {
	m := sample(fams, name, nil)
	if m == nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

// TestDaemonHealthAndMetrics runs the daemon with its HTTP endpoints on a
// loopback port and checks them as kubelet and Prometheus would: liveness,
// readiness gated on a --ready-file, and the metrics after real AddPods,
// a refused call and a drift repair.
func TestDaemonHealthAndMetrics(t *testing.T) {
	nstest.RequirePrivileged(t)
	dir := t.TempDir()
	readyFile := filepath.Join(dir, "cni-ready")
	d := startDaemon(t, daemonOpts{dir: dir, args: []string{
		"--metrics-address", "127.0.0.1:0",
		"--ready-file", readyFile,
		"--reconcile-interval", "500ms",
	}})
	addr := d.httpAddr(t)
	base := "http://" + addr

	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK || !strings.Contains(body, "ok grpc") {
		t.Errorf("/healthz: %d %q; want 200", code, body)
	}
	code, body := httpGet(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "FAIL file "+readyFile) || !strings.Contains(body, "ok startup reconcile") {
		t.Errorf("/readyz without the ready file: %d %q; want 503 naming the file", code, body)
	}
	if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := httpGet(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with the ready file: %d %q; want 200", code, body)
	}

	c := d.client(t)
	const n = 3
	var pods []*nstest.Netns
	for i := range n {
		ns := nstest.NewNetns(t)
		pods = append(pods, ns)
		if _, err := c.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: fmt.Sprintf("e2e-metrics-%d", i), NetnsPath: ns.Path}); err != nil {
			t.Fatalf("AddPod %d: %v", i, err)
		}
	}
	_, err := c.AddPod(t.Context(), &nftredirv1.AddPodRequest{PodUid: "e2e-metrics-bad", NetnsPath: "relative/path"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("AddPod with a relative path: %v; want InvalidArgument", err)
	}

	fams := scrape(t, addr)
	if h := sample(fams, "nftredir_pod_apply_duration_seconds", nil); h == nil || h.GetHistogram().GetSampleCount() != n {
		t.Errorf("nftredir_pod_apply_duration_seconds: %v; want a histogram of %d applies", h, n)
	}
	add := map[string]string{"grpc_service": "nftredir.v1.RedirectService", "grpc_method": "AddPod"}
	for code, want := range map[string]float64{"OK": n, "InvalidArgument": 1} {
		add["grpc_code"] = code
		if got := counter(fams, "nftredir_grpc_server_handled_total", add); got != want {
			t.Errorf("AddPod calls with code %s: %v; want %v", code, got, want)
		}
	}
	if got := gauge(fams, "nftredir_pods_enrolled"); got != n {
		t.Errorf("nftredir_pods_enrolled %v; want %d", got, n)
	}
	if h := sample(fams, "nftredir_reconcile_duration_seconds", nil); h == nil || h.GetHistogram().GetSampleCount() < 1 {
		t.Errorf("nftredir_reconcile_duration_seconds: %v; want the startup pass at least", h)
	}
	if sample(fams, "nftredir_build_info", nil) == nil || sample(fams, "go_goroutines", nil) == nil {
		t.Error("build info or Go runtime metrics missing")
	}
	if got := counter(fams, "nftredir_drift_repairs_total", nil); got != 0 {
		t.Errorf("nftredir_drift_repairs_total %v before any drift; want 0", got)
	}

	// Drift: the table deleted behind the daemon's back is repaired by the
	// next pass, and counted.
	pods[0].Nft(t, "delete", "table", "inet", "nftredir")
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams = scrape(t, addr)
		if counter(fams, "nftredir_drift_repairs_total", nil) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nftredir_drift_repairs_total %v after the table was deleted; want 1", counter(fams, "nftredir_drift_repairs_total", nil))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if h := sample(fams, "nftredir_pod_apply_duration_seconds", nil); h.GetHistogram().GetSampleCount() != n+1 {
		t.Errorf("apply histogram count %d after the repair; want %d", h.GetHistogram().GetSampleCount(), n+1)
	}
}

// TestDaemonHTTPSurvivesBadClients sends what a broken or hostile client
// might: oversized headers, a half-sent request, an unknown path, a POST.
// The daemon answers each as HTTP says and keeps serving.
func TestDaemonHTTPSurvivesBadClients(t *testing.T) {
	nstest.RequirePrivileged(t)
	d := startDaemon(t, daemonOpts{args: []string{"--metrics-address", "127.0.0.1:0"}})
	addr := d.httpAddr(t)

	raw := func(req string) string {
		t.Helper()
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, req); err != nil {
			return "write: " + err.Error()
		}
		line, _ := bufio.NewReader(conn).ReadString('\n')
		return line
	}
	big := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"
	if got := raw(big); !strings.Contains(got, "431") {
		t.Errorf("64 KiB of headers: %q; want 431", got)
	}
	if got := raw("POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"); !strings.Contains(got, "405") {
		t.Errorf("POST /readyz: %q; want 405", got)
	}
	if got := raw("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"); !strings.Contains(got, "404") {
		t.Errorf("GET /nope: %q; want 404", got)
	}
	if got := raw("garbage\r\n\r\n"); !strings.Contains(got, "400") {
		t.Errorf("garbage: %q; want 400", got)
	}
	// A client that sends half a request line is dropped after the header
	// timeout; meanwhile others are served.
	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	io.WriteString(half, "GET /hea")
	if code, _ := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz beside a stalled client: %d", code)
	}
	half.SetReadDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	if _, err := half.Read(make([]byte, 1)); err == nil {
		// A 408 may come first; the connection is then closed.
		t.Logf("stalled client got an answer after %s", time.Since(start))
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("a stalled client was held for 15s; want it dropped after the header timeout")
	}
	if code, _ := httpGet(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the bad clients: %d", code)
	}
}
