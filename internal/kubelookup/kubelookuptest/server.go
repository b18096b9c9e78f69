// Package kubelookuptest is a stand-in for the two GETs of the Kubernetes
// API that kubelookup makes, over TLS with a bearer token, for unit tests
// of the plugin and of kubelookup. It serves k8s.io/api objects encoded as
// the API server encodes them (encoding/json of the same types), and
// answers errors as the API server does (a Status object). e2e
// TestK8sBlastRadius runs kubelookup against the real kube-apiserver.
package kubelookuptest

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftredir/nftredir/internal/kubelookup"
)

// Token is the bearer token the server accepts.
const Token = "kubelookuptest-token"

// Server is a TLS server answering GET /api/v1/namespaces/NS and
// /api/v1/namespaces/NS/pods/NAME.
type Server struct {
	srv *httptest.Server

	mu    sync.Mutex // protects the fields below
	pods  map[string]*corev1.Pod
	nss   map[string]*corev1.Namespace
	fail  int // an HTTP status every request gets, 0 for none
	calls int
}

// Start starts a server, closed when the test ends.
func Start(t testing.TB) *Server {
	s := &Server{pods: map[string]*corev1.Pod{}, nss: map[string]*corev1.Namespace{}}
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// Close stops the server: the API unreachable.
func (s *Server) Close() { s.srv.Close() }

// URL is the server's https URL.
func (s *Server) URL() string { return s.srv.URL }

// CAPEM is the server certificate, the CA a client must trust.
func (s *Server) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

// Kubeconfig writes a kubeconfig for the server, as nftredir-cni install
// writes one, into dir and returns its path.
func (s *Server) Kubeconfig(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p, kubelookup.NewKubeconfig(s.URL(), s.CAPEM(), Token).Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// AddPod stores a pod (and replaces one of the same name).
func (s *Server) AddPod(p *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[p.Namespace+"/"+p.Name] = p.DeepCopy()
}

// AddNamespace stores a namespace.
func (s *Server) AddNamespace(ns *corev1.Namespace) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nss[ns.Name] = ns.DeepCopy()
}

// Fail makes every request answer code (0: answer normally).
func (s *Server) Fail(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = code
}

// Calls counts the requests served.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if r.Header.Get("Authorization") != "Bearer "+Token {
		status(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	if s.fail != 0 {
		status(w, s.fail, metav1.StatusReasonServiceUnavailable, "the stand-in fails as told")
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/")
	var obj any
	switch {
	case r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/"):
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	case len(parts) == 1:
		ns, ok := s.nss[parts[0]]
		if !ok {
			status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("namespaces %q not found", parts[0]))
			return
		}
		c := ns.DeepCopy()
		c.TypeMeta = metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"}
		obj = c
	case len(parts) == 3 && parts[1] == "pods":
		p, ok := s.pods[parts[0]+"/"+parts[2]]
		if !ok {
			status(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pods %q not found", parts[2]))
			return
		}
		c := p.DeepCopy()
		c.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		obj = c
	default:
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(obj)
}

func status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
}
