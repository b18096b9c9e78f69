// Package kubelookup reads a pod and its namespace from the Kubernetes API
// with two GETs, for nftredir-cni's decision when nftredird cannot answer
// (docs/blast-radius.md).
//
// It is not client-go. The plugin is a process the runtime execs for every
// pod, and client-go's package initialisation and size would cost every
// exec milliseconds and megabytes; this package decodes only the fields the
// enrolment rule reads, with net/http. A test against the real
// kube-apiserver (e2e TestK8sBlastRadius) holds its decoding to the API's.
package kubelookup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/enrolment"
)

// Kubeconfig is the subset of a kubeconfig this package reads and writes,
// in its JSON form (which kubectl reads as well as YAML): one cluster, one
// user with a bearer token, one context.
type Kubeconfig struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
}

type namedCluster struct {
	Name    string  `json:"name"`
	Cluster cluster `json:"cluster"`
}

type cluster struct {
	Server                   string `json:"server"`
	CertificateAuthorityData string `json:"certificate-authority-data,omitempty"`
	CertificateAuthority     string `json:"certificate-authority,omitempty"`
}

type namedUser struct {
	Name string `json:"name"`
	User user   `json:"user"`
}

type user struct {
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
}

type namedContext struct {
	Name    string   `json:"name"`
	Context kcontext `json:"context"`
}

type kcontext struct {
	Cluster string `json:"cluster"`
	User    string `json:"user"`
}

const ctxName = "nftredir-cni"

// NewKubeconfig is the kubeconfig "nftredir-cni install" writes: the API
// server's URL, its CA bundle (PEM) and a service account token.
func NewKubeconfig(server string, caPEM []byte, token string) *Kubeconfig {
	return &Kubeconfig{
		APIVersion:     "v1",
		Kind:           "Config",
		Clusters:       []namedCluster{{Name: ctxName, Cluster: cluster{Server: server, CertificateAuthorityData: base64.StdEncoding.EncodeToString(caPEM)}}},
		Users:          []namedUser{{Name: ctxName, User: user{Token: token}}},
		Contexts:       []namedContext{{Name: ctxName, Context: kcontext{Cluster: ctxName, User: ctxName}}},
		CurrentContext: ctxName,
	}
}

// Marshal is the file's content.
func (k *Kubeconfig) Marshal() []byte {
	b, _ := json.MarshalIndent(k, "", "  ")
	return append(b, '\n')
}

// Client makes the two GETs.
type Client struct {
	server *url.URL
	token  string
	http   *http.Client
}

// Option configures a Client.
type Option func(*options)

type options struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// WithDialContext makes the client's connections with dial: a test
// reaches an API server that listens in another network namespace.
func WithDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) { o.dial = dial }
}

// Load reads a kubeconfig in JSON form and returns a client of its current
// context's cluster.
func Load(path string, opts ...Option) (*Client, error) {
	o := options{dial: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}
	for _, f := range opts {
		f(&o)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig: %w", err)
	}
	var k Kubeconfig
	if err := json.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("kubeconfig %s is not the JSON form nftredir-cni install writes: %w", path, err)
	}
	var cl *cluster
	var us *user
	for _, c := range k.Contexts {
		if c.Name != k.CurrentContext {
			continue
		}
		for i := range k.Clusters {
			if k.Clusters[i].Name == c.Context.Cluster {
				cl = &k.Clusters[i].Cluster
			}
		}
		for i := range k.Users {
			if k.Users[i].Name == c.Context.User {
				us = &k.Users[i].User
			}
		}
	}
	if cl == nil || us == nil {
		return nil, fmt.Errorf("kubeconfig %s: current-context %q names no cluster and user", path, k.CurrentContext)
	}
	u, err := url.Parse(cl.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("kubeconfig %s: server %q is not an https URL", path, cl.Server)
	}
	pool := x509.NewCertPool()
	ca := []byte(nil)
	switch {
	case cl.CertificateAuthorityData != "":
		if ca, err = base64.StdEncoding.DecodeString(cl.CertificateAuthorityData); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: certificate-authority-data: %w", path, err)
		}
	case cl.CertificateAuthority != "":
		if ca, err = os.ReadFile(cl.CertificateAuthority); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	default:
		return nil, fmt.Errorf("kubeconfig %s: no certificate authority for %s", path, cl.Server)
	}
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("kubeconfig %s: no PEM certificate in the certificate authority", path)
	}
	token := us.Token
	if token == "" && us.TokenFile != "" {
		b, err := os.ReadFile(us.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return nil, fmt.Errorf("kubeconfig %s: no token for %s", path, cl.Server)
	}
	tr := &http.Transport{
		// Not the environment's proxy: the plugin runs with the
		// runtime's environment, which is not meant for it.
		Proxy:               nil,
		DialContext:         o.dial,
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 2 * time.Second,
		ForceAttemptHTTP2:   false,
		MaxIdleConns:        1,
	}
	return &Client{server: u, token: token, http: &http.Client{Transport: tr}}, nil
}

// StatusError is an answer of the API other than 200: its HTTP code and
// the Status object's reason and message when it sent one.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	return fmt.Sprintf("the Kubernetes API answered %d %s: %s", e.Code, e.Reason, msg)
}

// IsNotFound reports a 404.
func IsNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}

// transient says whether another try may get an answer: the server
// unreachable or slow (a transport error), overloaded or failing (429,
// 5xx). A request it refuses, or an answer that is not the object asked
// for, would be the same again.
func transient(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusTooManyRequests || se.Code >= 500
	}
	var ue *url.Error
	return errors.As(err, &ue)
}

// objectMeta and the types below are the fields the rule reads, with the
// API's JSON names.
type objectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace"`
	UID               string            `json:"uid"`
	Labels            map[string]string `json:"labels"`
	Annotations       map[string]string `json:"annotations"`
	DeletionTimestamp *string           `json:"deletionTimestamp"`
}

type container struct {
	Name string `json:"name"`
}

type podObject struct {
	Kind     string     `json:"kind"`
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		HostNetwork    bool        `json:"hostNetwork"`
		Containers     []container `json:"containers"`
		InitContainers []container `json:"initContainers"`
	} `json:"spec"`
}

type namespaceObject struct {
	Kind     string     `json:"kind"`
	Metadata objectMeta `json:"metadata"`
}

// Pod is a pod as the API has it: what the rule reads and its identity.
type Pod struct {
	enrolment.Pod
	UID string
	// MirrorOf is, for a static pod's mirror, the UID the kubelet gives
	// the pod itself (and its sandboxes).
	MirrorOf string
}

// mirrorAnnotation carries, on a static pod's mirror, the kubelet's UID
// of the pod (the one in CNI_ARGS).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// Pod reads pod ns/name.
func (c *Client) Pod(ctx context.Context, ns, name string) (*Pod, error) {
	var o podObject
	if err := c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name), &o); err != nil {
		return nil, err
	}
	if o.Kind != "Pod" {
		return nil, fmt.Errorf("the Kubernetes API answered a %q for pod %s/%s", o.Kind, ns, name)
	}
	p := &Pod{
		Pod: enrolment.Pod{
			Namespace:   o.Metadata.Namespace,
			Labels:      o.Metadata.Labels,
			Annotations: o.Metadata.Annotations,
			HostNetwork: o.Spec.HostNetwork,
			Deleting:    o.Metadata.DeletionTimestamp != nil,
		},
		UID:      o.Metadata.UID,
		MirrorOf: o.Metadata.Annotations[mirrorAnnotation],
	}
	for _, cs := range [][]container{o.Spec.InitContainers, o.Spec.Containers} {
		for _, ct := range cs {
			p.Containers = append(p.Containers, ct.Name)
		}
	}
	return p, nil
}

// NamespaceLabels reads namespace name's labels.
func (c *Client) NamespaceLabels(ctx context.Context, name string) (map[string]string, error) {
	var o namespaceObject
	if err := c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(name), &o); err != nil {
		return nil, err
	}
	if o.Kind != "Namespace" {
		return nil, fmt.Errorf("the Kubernetes API answered a %q for namespace %s", o.Kind, name)
	}
	return o.Metadata.Labels, nil
}

// maxBody bounds what is read of an answer: a pod is a few KiB, and
// nothing the plugin reads may grow without bound.
const maxBody = 4 << 20

// get reads one object. No resourceVersion is given, so the API server
// answers from etcd with a quorum read: a label whose PATCH returned
// before this GET was sent is in the answer.
func (c *Client) get(ctx context.Context, path string, into any) error {
	u := *c.server
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawPath = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "nftredir-cni")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		se := &StatusError{Code: resp.StatusCode}
		var st struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &st) == nil {
			se.Reason, se.Message = st.Reason, st.Message
		}
		return se
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("decode the Kubernetes API's answer for %s: %w", path, err)
	}
	return nil
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }
