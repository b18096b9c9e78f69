package install

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ReaderToken says which token the plugin's kubeconfig carries when it is
// not the installer's own: one of a read-only ServiceAccount, asked for
// with the TokenRequest API for a short life, so that the file on the
// host can do nothing but the plugin's reads, for an hour at most after
// the installer last renewed it, and not at all once the account is
// deleted.
//
// It is bound to no object. The API refuses to bind a token to a pod that
// runs as another ServiceAccount ("cannot bind token for serviceaccount
// ... to pod running with different serviceaccount name"), and binding
// to the Node is not there before Kubernetes 1.31 (beta) or 1.33 (GA);
// the short life and the account's deletion at uninstall end it instead.
type ReaderToken struct {
	// Namespace and Account name the ServiceAccount.
	Namespace, Account string
}

// readerTokenLifetime is what each token is asked for: the kubelet's own
// for projected tokens, and the most the chart's admission policy lets
// the agent ask for.
const readerTokenLifetime = time.Hour

// renewAfter is the part of a token's life after which a new one is
// asked for, as the kubelet renews projected tokens: the rest leaves
// room for an API that does not answer for a while.
const renewAfter = 0.8

// tokenRequestTimeout bounds one TokenRequest.
const tokenRequestTimeout = 10 * time.Second

func (r *ReaderToken) check() error {
	var errs []error
	if r.Namespace == "" || r.Account == "" {
		errs = append(errs, errors.New("the plugin's read-only ServiceAccount needs a namespace and a name (--pod-namespace, --kube-reader-account)"))
	}
	return errors.Join(errs...)
}

// issuedToken is a token the API gave, and when to replace it.
type issuedToken struct {
	token            string
	renewAt, expires time.Time
}

// valid says whether the token may still be used at now, with a margin
// for clocks and the request in flight.
func (t *issuedToken) valid(now time.Time) bool {
	return t != nil && now.Before(t.expires.Add(-time.Minute))
}

// tokenRequest is authentication.k8s.io/v1 TokenRequest, the fields used:
// the spec asked, the status answered.
type tokenRequest struct {
	APIVersion string              `json:"apiVersion"`
	Kind       string              `json:"kind"`
	Spec       tokenRequestSpec    `json:"spec"`
	Status     *tokenRequestStatus `json:"status,omitempty"`
}

type tokenRequestSpec struct {
	ExpirationSeconds int64 `json:"expirationSeconds"`
}

type tokenRequestStatus struct {
	Token               string    `json:"token"`
	ExpirationTimestamp time.Time `json:"expirationTimestamp"`
}

// requestToken asks the API server at server (trusting caPEM) for a token
// of r's account, authenticating with bearer.
func requestToken(ctx context.Context, server string, caPEM []byte, bearer string, r *ReaderToken) (*issuedToken, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no PEM certificate in the cluster's CA bundle")
	}
	u, err := url.Parse(server)
	if err != nil {
		return nil, err
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/namespaces/" + url.PathEscape(r.Namespace) + "/serviceaccounts/" + url.PathEscape(r.Account) + "/token"
	var body tokenRequest
	body.APIVersion, body.Kind = "authentication.k8s.io/v1", "TokenRequest"
	body.Spec = tokenRequestSpec{ExpirationSeconds: int64(readerTokenLifetime / time.Second)}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, tokenRequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "nftredir-cni-install")
	hc := &http.Client{Transport: &http.Transport{
		// The in-cluster address, never a proxy from the environment.
		Proxy:               nil,
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 5 * time.Second,
	}}
	defer hc.CloseIdleConnections()
	sent := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		var st struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(out, &st)
		return nil, fmt.Errorf("the Kubernetes API answered %s: %s", resp.Status, st.Message)
	}
	var got tokenRequest
	if err := json.Unmarshal(out, &got); err != nil {
		return nil, fmt.Errorf("decode the TokenRequest answer: %w", err)
	}
	if got.Status == nil || got.Status.Token == "" || got.Status.ExpirationTimestamp.IsZero() {
		return nil, errors.New("the TokenRequest answer holds no token or no expiry")
	}
	// Timed from the request's start: the token may be older than its
	// arrival, never younger.
	life := got.Status.ExpirationTimestamp.Sub(sent)
	return &issuedToken{
		token:   got.Status.Token,
		renewAt: sent.Add(time.Duration(float64(life) * renewAfter)),
		expires: got.Status.ExpirationTimestamp,
	}, nil
}
