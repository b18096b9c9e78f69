// Package podowner tells a DaemonSet's pod, as it stops, why it stops: its
// DaemonSet is being deleted (an uninstall: take nftredir off the node) or
// anything else (a restart, a rolling update, a drain, a reboot: leave
// everything in place, so no pod starts uncaptured before the next pod of
// the DaemonSet takes over). istio-cni's node agent makes the same call
// (ShouldStopCleanup in cni/pkg/nodeagent/server.go).
//
// The CNI install step and the daemon both ask, each for itself, through
// the one Client here: the install step is the same executable as the CNI
// plugin, which the runtime starts for every pod, and client-go made each
// of those starts about 2 ms of CPU slower (measured: 5.6 against 3.5 ms
// per VERSION exec), net/http alone 0.3 ms. So the client is two GETs
// over net/http; the daemon hands it client-go's authenticated transport.
package podowner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Verdict is what the API says about the pod's DaemonSet.
type Verdict int

const (
	// Unknown: the API could not be asked or could not tell (no owner, the
	// pod itself gone). Callers treat it as Lives: leaving the plugin in
	// place fails closed, removing it could let pods start uncaptured.
	Unknown Verdict = iota
	// Lives: the DaemonSet that owns the pod is there and not being
	// deleted, or a DaemonSet of its name replaced it.
	Lives
	// Deleted: the owning DaemonSet is gone or has a deletionTimestamp.
	Deleted
)

func (v Verdict) String() string {
	switch v {
	case Lives:
		return "lives"
	case Deleted:
		return "deleted"
	}
	return "unknown"
}

// ServiceAccountDir is where the kubelet mounts a pod's token and CA.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client asks the API server about one pod's owner.
type Client struct {
	hc   *http.Client
	host *url.URL
	// token, when set, is read at every request: projected tokens are
	// rotated by the kubelet while the pod runs.
	token string
}

// New uses hc, which authenticates itself (client-go's rest.HTTPClientFor),
// against the API server at host.
func New(hc *http.Client, host string) (*Client, error) {
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("API server %q is not a URL", host)
	}
	return &Client{hc: hc, host: u}, nil
}

// InCluster uses the pod's ServiceAccount (token and CA under dir) and
// the API server named by KUBERNETES_SERVICE_HOST and _PORT.
func InCluster(dir string, lookupEnv func(string) (string, bool)) (*Client, error) {
	host, _ := lookupEnv("KUBERNETES_SERVICE_HOST")
	port, _ := lookupEnv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is not set")
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("the ServiceAccount's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", filepath.Join(dir, "ca.crt"))
	}
	token := filepath.Join(dir, "token")
	if _, err := os.Stat(token); err != nil {
		return nil, fmt.Errorf("the ServiceAccount's token: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 5 * time.Second,
	}}
	c, err := New(hc, "https://"+net.JoinHostPort(host, port))
	if err != nil {
		return nil, err
	}
	c.token = token
	return c, nil
}

// object is the part of a pod's or DaemonSet's JSON that matters here.
type object struct {
	Metadata struct {
		UID               string     `json:"uid"`
		DeletionTimestamp *string    `json:"deletionTimestamp"`
		OwnerReferences   []ownerRef `json:"ownerReferences"`
	} `json:"metadata"`
}

type ownerRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Controller *bool  `json:"controller"`
}

// checkAttempts and checkPause: the API may be briefly away (a control
// plane upgrade); a few tries a second apart, as istio-cni makes, fit in
// a pod's termination grace.
const (
	checkAttempts = 3
	checkPause    = time.Second
)

// Check asks whether the DaemonSet owning pod namespace/name is being
// deleted. why says what was found, for the log. err is set with
// Unknown when the API could not be asked.
func (c *Client) Check(ctx context.Context, namespace, name string) (v Verdict, why string, err error) {
	for attempt := 1; ; attempt++ {
		v, why, err = c.check(ctx, namespace, name)
		var perm *permanentError
		if err == nil || errors.As(err, &perm) || attempt >= checkAttempts {
			return v, why, err
		}
		select {
		case <-ctx.Done():
			return v, why, err
		case <-time.After(checkPause):
		}
	}
}

func (c *Client) check(ctx context.Context, namespace, name string) (Verdict, string, error) {
	pod, err := c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/pods/"+url.PathEscape(name))
	if err != nil {
		return Unknown, "", fmt.Errorf("read pod %s/%s: %w", namespace, name, err)
	}
	owner := daemonSetOwner(pod)
	if pod != nil && owner != nil {
		ns, err := c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace))
		if err != nil {
			return Unknown, "", fmt.Errorf("read namespace %s: %w", namespace, err)
		}
		if ns == nil || ns.Metadata.DeletionTimestamp != nil {
			return Deleted, fmt.Sprintf("namespace %s is being deleted", namespace), nil
		}
	}
	var ds *object
	if pod != nil && owner != nil {
		ds, err = c.get(ctx, "/apis/apps/v1/namespaces/"+url.PathEscape(namespace)+"/daemonsets/"+url.PathEscape(owner.Name))
		if err != nil {
			return Unknown, "", fmt.Errorf("read DaemonSet %s/%s: %w", namespace, owner.Name, err)
		}
	}
	v, why := decide(pod, owner, ds)
	return v, why, nil
}

// daemonSetOwner is the pod's controlling DaemonSet, if any.
func daemonSetOwner(pod *object) *ownerRef {
	if pod == nil {
		return nil
	}
	for i, o := range pod.Metadata.OwnerReferences {
		if o.Kind == "DaemonSet" && strings.HasPrefix(o.APIVersion, "apps/") && o.Controller != nil && *o.Controller {
			return &pod.Metadata.OwnerReferences[i]
		}
	}
	return nil
}

// decide is the rule. pod nil: the pod is gone from the API; ds nil: the
// DaemonSet is.
func decide(pod *object, owner *ownerRef, ds *object) (Verdict, string) {
	switch {
	case pod == nil:
		// Force-deleted (a DaemonSet's deletion deletes its pods
		// gracefully, so they are still there while they stop).
		return Unknown, "the pod is gone from the API, so its owner cannot be told"
	case owner == nil:
		return Unknown, "the pod has no controlling DaemonSet"
	case ds == nil:
		return Deleted, fmt.Sprintf("DaemonSet %s is gone", owner.Name)
	case ds.Metadata.UID != owner.UID:
		// Deleted and created again under the same name (helm uninstall
		// and install in a row): the new DaemonSet's pod takes over what
		// is installed, so nothing is taken away in between.
		return Lives, fmt.Sprintf("DaemonSet %s was replaced by a new one (uid %s, was %s)", owner.Name, ds.Metadata.UID, owner.UID)
	case ds.Metadata.DeletionTimestamp != nil:
		return Deleted, fmt.Sprintf("DaemonSet %s is being deleted (since %s)", owner.Name, *ds.Metadata.DeletionTimestamp)
	}
	return Lives, fmt.Sprintf("DaemonSet %s is there and not being deleted: a restart or an update", owner.Name)
}

// permanentError is an answer no retry changes (a missing permission).
type permanentError struct{ error }

func (e *permanentError) Unwrap() error { return e.error }

// requestTimeout bounds one GET.
const requestTimeout = 5 * time.Second

// get reads path as JSON; nil, nil when the API says 404.
func (c *Client) get(ctx context.Context, path string) (*object, error) {
	return c.getInto(ctx, path, nil)
}

// request is a GET of pathQuery with the token, if any.
func (c *Client) request(ctx context.Context, pathQuery string) (*http.Request, error) {
	path, query, _ := strings.Cut(pathQuery, "?")
	u := *c.host
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "nftredir-podowner")
	if c.token != "" {
		tok, err := os.ReadFile(c.token)
		if err != nil {
			return nil, fmt.Errorf("the ServiceAccount's token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return req, nil
}

// getInto is get that also decodes the body into extra (if not nil).
func (c *Client) getInto(ctx context.Context, path string, extra any) (*object, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := c.request(ctx, path)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, &permanentError{fmt.Errorf("%s: %s (the ServiceAccount needs get on pods and get, list and watch on daemonsets.apps in this namespace): %s", path, resp.Status, snippet(body))}
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s: %s: %s", path, resp.Status, snippet(body))
	}
	var o object
	if err := json.Unmarshal(body, &o); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if extra != nil {
		if err := json.Unmarshal(body, extra); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return &o, nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
