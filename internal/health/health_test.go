package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ready")
	slow := Check{Name: "slow", Check: func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}}
	h := NewHandler(Config{
		Liveness:     []Check{{Name: "alive", Check: func(context.Context) error { return nil }}},
		Readiness:    []Check{FileExists(file), {Name: "broken", Check: func(context.Context) error { return errors.New("boom") }}},
		Metrics:      http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") }),
		CheckTimeout: 50 * time.Millisecond,
	})
	s, err := Listen("127.0.0.1:0", h, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Shutdown(time.Second)
	base := "http://" + s.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok alive\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	code, body := get("/readyz")
	if code != 503 || !strings.Contains(body, "FAIL file "+file+": "+file+" does not exist yet") || !strings.Contains(body, "FAIL broken: boom") {
		t.Errorf("/readyz: %d %q; want 503 listing both failures", code, body)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "ok file "+file) || !strings.Contains(body, "FAIL broken") {
		t.Errorf("/readyz with the file: %d %q", code, body)
	}
	if code, body := get("/metrics"); code != 200 || body != "m 1\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, _ := get("/other"); code != 404 {
		t.Errorf("/other: %d, want 404", code)
	}

	// A check that hangs is cut off by the timeout, not the probe's.
	h.cfg.Liveness = []Check{slow}
	start := time.Now()
	if code, body := get("/healthz"); code != 503 || !strings.Contains(body, "FAIL slow: context deadline exceeded") || time.Since(start) > 2*time.Second {
		t.Errorf("hanging check: %d %q after %s", code, body, time.Since(start))
	}
}

func TestListenBusyPort(t *testing.T) {
	s, err := Listen("127.0.0.1:0", http.NotFoundHandler(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(time.Second)
	if _, err := Listen(s.Addr().String(), http.NotFoundHandler(), nil); err == nil || !strings.Contains(err.Error(), "metrics address") {
		t.Errorf("second Listen on %s: %v; want an error", s.Addr(), err)
	}
}
