package podowner

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const podJSON = `{"metadata":{"uid":"p1","ownerReferences":[
  {"apiVersion":"v1","kind":"Node","name":"n","uid":"x"},
  {"apiVersion":"apps/v1","kind":"DaemonSet","name":"nftredir","uid":"ds1","controller":true}]}}`

// api serves the pod and DaemonSet bodies given ("" is a 404), counting
// requests.
func api(t *testing.T, pod, ds string, status int) (*Client, *atomic.Int32) {
	return apiNS(t, pod, ds, `{"metadata":{"uid":"ns1"}}`, status)
}

func apiNS(t *testing.T, pod, ds, nsBody string, status int) (*Client, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if status != 0 {
			w.WriteHeader(status)
			return
		}
		var body string
		switch r.URL.Path {
		case "/api/v1/namespaces/sys":
			body = nsBody
		case "/api/v1/namespaces/sys/pods/nftredir-abc":
			body = pod
		case "/apis/apps/v1/namespaces/sys/daemonsets/nftredir":
			body = ds
		}
		if body == "" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c, &n
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, pod, ds string
		want          Verdict
		why           string
	}{
		{"DaemonSet there", podJSON, `{"metadata":{"uid":"ds1"}}`, Lives, "a restart or an update"},
		{"DaemonSet gone", podJSON, "", Deleted, "gone"},
		{"DaemonSet being deleted", podJSON, `{"metadata":{"uid":"ds1","deletionTimestamp":"2026-12-01T22:00:00Z"}}`, Deleted, "being deleted"},
		{"replaced under the same name", podJSON, `{"metadata":{"uid":"ds2"}}`, Lives, "replaced"},
		{"replacement being deleted is still a replacement", podJSON, `{"metadata":{"uid":"ds2","deletionTimestamp":"x"}}`, Lives, "replaced"},
		{"pod gone", "", `{"metadata":{"uid":"ds1"}}`, Unknown, "pod is gone"},
		{"no DaemonSet owner", `{"metadata":{"uid":"p1","ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"nftredir","uid":"ds1"}]}}`, "", Unknown, "no controlling DaemonSet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := api(t, tc.pod, tc.ds, 0)
			v, why, err := c.Check(context.Background(), "sys", "nftredir-abc")
			if err != nil || v != tc.want || !strings.Contains(why, tc.why) {
				t.Fatalf("Check = %s, %q, %v; want %s, ...%q...", v, why, err, tc.want, tc.why)
			}
		})
	}
}

// A pod whose namespace is being deleted is going away with its
// DaemonSet, even while the DaemonSet is still there.
func TestCheckNamespaceBeingDeleted(t *testing.T) {
	c, _ := apiNS(t, podJSON, `{"metadata":{"uid":"ds1"}}`, `{"metadata":{"uid":"ns1","deletionTimestamp":"2026-12-01T22:00:00Z"}}`, 0)
	v, why, err := c.Check(context.Background(), "sys", "nftredir-abc")
	if err != nil || v != Deleted || !strings.Contains(why, "namespace sys") {
		t.Fatalf("Check = %s, %q, %v; want deleted because of the namespace", v, why, err)
	}
}

func TestCheckForbiddenIsNotRetried(t *testing.T) {
	c, n := api(t, "", "", http.StatusForbidden)
	v, _, err := c.Check(context.Background(), "sys", "nftredir-abc")
	var perm *permanentError
	if v != Unknown || !errors.As(err, &perm) || !strings.Contains(err.Error(), "daemonsets.apps") {
		t.Fatalf("Check = %s, %v; want Unknown and a permission error naming what is needed", v, err)
	}
	if n.Load() != 1 {
		t.Errorf("%d requests; a 403 must not be retried", n.Load())
	}
}

func TestCheckRetriesServerErrors(t *testing.T) {
	c, n := api(t, "", "", http.StatusServiceUnavailable)
	v, _, err := c.Check(context.Background(), "sys", "nftredir-abc")
	if v != Unknown || err == nil {
		t.Fatalf("Check = %s, %v; want Unknown with an error", v, err)
	}
	if n.Load() != checkAttempts {
		t.Errorf("%d requests; want %d", n.Load(), checkAttempts)
	}
}

func TestInClusterSendsTheCurrentToken(t *testing.T) {
	dir := t.TempDir()
	var auth atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	host, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "https://"), ":")
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if _, err := InCluster(dir, lookup); err == nil {
		t.Fatal("InCluster without a CA file succeeded")
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), certPEM(t, srv), 0o644); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("one\n"), 0o600)
	c, err := InCluster(dir, lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"one", "two"} {
		os.WriteFile(tok, []byte(want+"\n"), 0o600)
		if v, _, err := c.check(context.Background(), "sys", "p"); v != Unknown || err != nil {
			t.Fatalf("check = %s, %v", v, err)
		}
		if got := auth.Load(); got != "Bearer "+want {
			t.Errorf("Authorization %q; want the token file's current %q", got, want)
		}
	}
	if _, err := InCluster(dir, func(string) (string, bool) { return "", false }); err == nil {
		t.Error("InCluster outside a pod succeeded")
	}
}

func certPEM(t *testing.T, srv *httptest.Server) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// The watch learns of the deletion while it is authorised, and the
// verdict at the stop holds it even when the API refuses this pod by
// then (its ServiceAccount and bindings deleted with the DaemonSet).
func TestWatchSeesTheDeletionBeforeTheStop(t *testing.T) {
	deleted := make(chan struct{})
	var refuse atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		switch {
		case r.URL.Path == "/api/v1/namespaces/sys":
			w.Write([]byte(`{"metadata":{"uid":"ns1","resourceVersion":"3"}}`))
		case r.URL.Path == "/api/v1/namespaces/sys/pods/nftredir-abc":
			w.Write([]byte(podJSON))
		case r.URL.Path == "/apis/apps/v1/namespaces/sys/daemonsets/nftredir":
			w.Write([]byte(`{"metadata":{"uid":"ds1","resourceVersion":"7"}}`))
		case r.URL.Path == "/apis/apps/v1/namespaces/sys/daemonsets" && r.URL.Query().Get("watch") == "1":
			if r.URL.Query().Get("resourceVersion") != "7" || r.URL.Query().Get("fieldSelector") != "metadata.name=nftredir" {
				t.Errorf("watch query %s", r.URL.RawQuery)
			}
			fl := w.(http.Flusher)
			w.Write([]byte(`{"type":"MODIFIED","object":{"metadata":{"uid":"ds1"}}}` + "\n"))
			fl.Flush()
			<-deleted
			w.Write([]byte(`{"type":"DELETED","object":{"metadata":{"uid":"ds1"}}}` + "\n"))
			fl.Flush()
		case r.URL.Path == "/api/v1/namespaces" && r.URL.Query().Get("watch") == "1":
			// No news of the namespace until the test ends.
			select {
			case <-r.Context().Done():
			case <-deleted:
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c, _ := New(srv.Client(), srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := c.Watch(ctx, "sys", "nftredir-abc", func(msg string, kv ...any) { t.Log(msg, kv) })
	time.Sleep(200 * time.Millisecond)
	if v, _ := w.seenVerdict(); v != Lives {
		t.Fatalf("before the deletion the watch says %s; want lives", v)
	}
	if v, _, err := w.Verdict(ctx); v != Lives || err != nil {
		t.Fatalf("Verdict before the deletion = %s, %v; want lives", v, err)
	}
	close(deleted)
	time.Sleep(200 * time.Millisecond)
	refuse.Store(true)
	if v, why, err := w.Verdict(ctx); v != Deleted || err != nil || !strings.Contains(why, "watched") {
		t.Fatalf("Verdict after the deletion, API refusing = %s, %q, %v; want deleted (watched)", v, why, err)
	}
}

// A DaemonSet already gone when the watch starts is a deletion seen.
func TestWatchDaemonSetGoneAtStart(t *testing.T) {
	c, _ := api(t, podJSON, "", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := c.Watch(ctx, "sys", "nftredir-abc", nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, why := w.seenVerdict(); v == Deleted {
			if !strings.Contains(why, "gone") {
				t.Errorf("why %q", why)
			}
			return
		}
		if time.Now().After(deadline) {
			v, why := w.seenVerdict()
			t.Fatalf("watch says %s (%s); want deleted", v, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A DaemonSet deleted and created again under its name (helm uninstall
// and install in a row) is a replacement: the new pods take over, nothing
// is uninstalled.
func TestWatchReplacementIsNotAnUninstall(t *testing.T) {
	var refuse atomic.Bool
	recreated := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		switch {
		case r.URL.Path == "/api/v1/namespaces/sys":
			w.Write([]byte(`{"metadata":{"uid":"ns1","resourceVersion":"3"}}`))
		case r.URL.Path == "/api/v1/namespaces/sys/pods/nftredir-abc":
			w.Write([]byte(podJSON))
		case r.URL.Path == "/apis/apps/v1/namespaces/sys/daemonsets/nftredir":
			w.Write([]byte(`{"metadata":{"uid":"ds1","resourceVersion":"7"}}`))
		case r.URL.Path == "/apis/apps/v1/namespaces/sys/daemonsets":
			fl := w.(http.Flusher)
			w.Write([]byte(`{"type":"DELETED","object":{"metadata":{"uid":"ds1"}}}` + "\n"))
			fl.Flush()
			time.Sleep(100 * time.Millisecond)
			w.Write([]byte(`{"type":"ADDED","object":{"metadata":{"uid":"ds2"}}}` + "\n"))
			fl.Flush()
			close(recreated)
			<-r.Context().Done()
		default:
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	c, _ := New(srv.Client(), srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := c.Watch(ctx, "sys", "nftredir-abc", nil)
	<-recreated
	time.Sleep(100 * time.Millisecond)
	refuse.Store(true)
	if v, why, _ := w.Verdict(ctx); v != Lives || !strings.Contains(why, "replaced") {
		t.Fatalf("Verdict after a replacement = %s, %q; want lives (replaced)", v, why)
	}
	cancel()
}
