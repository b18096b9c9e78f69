package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

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
// what the token and CA files say now: the kubelet replaces the projected
// token before it expires, and each sync (every file event and resync
// interval) follows it.
func (in *Installer) syncKubeconfig() error {
	k := in.cfg.Kubeconfig
	if k == nil {
		return nil
	}
	token, err := os.ReadFile(k.TokenFile)
	if err != nil {
		return fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	tok := strings.TrimSpace(string(token))
	if tok == "" {
		return fmt.Errorf("service account token %s is empty", k.TokenFile)
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
