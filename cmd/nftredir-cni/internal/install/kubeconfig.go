package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/durable"
	"github.com/nftredir/nftredir/internal/kubelookup"
)

// Where a pod finds its service account's credentials, and the
// variables the kubelet sets for the API's in-cluster address.
const (
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	// DefaultKubeconfigName is the kubeconfig's name in the CNI
	// configuration directory. Its extension is none of libcni's
	// (.conf, .conflist, .json), so no runtime loads it as a network.
	DefaultKubeconfigName = "nftredir-cni.kubeconfig"
)

// Kubeconfig says where the kubeconfig of the plugin's Kubernetes lookups
// comes from and goes (docs/blast-radius.md).
type Kubeconfig struct {
	// Path is where the installer writes it.
	Path string
	// TokenFile and CAFile are the service account's projected token
	// and the cluster's CA bundle; the kubelet rotates the token.
	TokenFile, CAFile string
	// Server is the API server's https URL as the node reaches it.
	Server string
	// Reader, when set, makes the kubeconfig carry a read-only account's
	// token, which TokenFile's requests, rather than TokenFile's own.
	Reader *ReaderToken
}

func (k *Kubeconfig) check() error {
	var errs []error
	for _, p := range []string{k.Path, k.TokenFile, k.CAFile} {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("kubeconfig source %q is not an absolute path", p))
		}
	}
	if !strings.HasPrefix(k.Server, "https://") {
		errs = append(errs, fmt.Errorf("the Kubernetes API server %q is not an https URL (set --kube-server, or run in a pod: KUBERNETES_SERVICE_HOST)", k.Server))
	}
	if k.Reader != nil {
		errs = append(errs, k.Reader.check())
	}
	return errors.Join(errs...)
}

// serverFromEnv is the in-cluster address the kubelet gives every pod.
func serverFromEnv(lookupEnv func(string) (string, bool)) string {
	host, _ := lookupEnv("KUBERNETES_SERVICE_HOST")
	port, _ := lookupEnv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return ""
	}
	return "https://" + net.JoinHostPort(host, port)
}

// syncKubeconfig writes the kubeconfig when it is missing or differs from
// what it should hold now: the token file's token, which the kubelet
// replaces before it expires, or the read-only account's, renewed here
// at 80% of its life. Each sync (every file event and resync interval,
// and the renewal's time: Run) follows it.
func (in *Installer) syncKubeconfig() error {
	k := in.cfg.Kubeconfig
	if k == nil {
		return nil
	}
	own, err := ownToken(k.TokenFile)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	tok, err := in.kubeconfigToken(own, ca)
	if err != nil {
		return err
	}
	want := kubelookup.NewKubeconfig(k.Server, ca, tok).Marshal()
	if have, err := os.ReadFile(k.Path); err == nil && bytes.Equal(have, want) {
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(k.Path), 0o755); err != nil {
		return err
	}
	// 0600: the token reads every pod and namespace.
	if err := durable.WriteFile(k.Path, want); err != nil {
		return fmt.Errorf("write the plugin's kubeconfig: %w", err)
	}
	in.log.Info("plugin kubeconfig written", "path", k.Path, "server", k.Server)
	return nil
}

// ownToken is the token file's token.
func ownToken(path string) (string, error) {
	token, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("service account token: %w", err)
	}
	tok := strings.TrimSpace(string(token))
	if tok == "" {
		return "", fmt.Errorf("service account token %s is empty", path)
	}
	return tok, nil
}

// kubeconfigToken is the token the kubeconfig carries: own (the token
// file's), or the read-only account's, which own asks for, again once
// past renewAt. A renewal that fails keeps the current token while it is
// valid (the API may be away for a while; the plugin only reads with it)
// and is tried again at the next sync.
func (in *Installer) kubeconfigToken(own string, ca []byte) (string, error) {
	k := in.cfg.Kubeconfig
	if k.Reader == nil {
		return own, nil
	}
	now := time.Now()
	cur := in.readerToken
	if cur != nil && now.Before(cur.renewAt) {
		return cur.token, nil
	}
	r := k.Reader
	t, err := requestToken(context.Background(), k.Server, ca, own, r)
	if err != nil {
		err = fmt.Errorf("request a token of ServiceAccount %s/%s for the plugin's kubeconfig: %w", r.Namespace, r.Account, err)
		if cur.valid(now) {
			in.log.Warn("cannot renew the plugin's token; the current one stays", "error", err, "expires", cur.expires)
			return cur.token, nil
		}
		return "", err
	}
	in.readerToken = t
	in.log.Info("plugin token issued", "service_account", r.Namespace+"/"+r.Account, "expires", t.expires, "renew_at", t.renewAt)
	return t.token, nil
}

// untilRenewal is how long until the read-only token is due for renewal;
// 0 when there is none to renew.
func (in *Installer) untilRenewal() time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.readerToken == nil {
		return 0
	}
	return max(time.Until(in.readerToken.renewAt), time.Millisecond)
}
