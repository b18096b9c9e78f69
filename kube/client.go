package kube

import (
	"fmt"

	"github.com/go-logr/logr/funcr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/nftredir/nftredir/internal/podowner"
)

// NewClient connects to the API server with the kubeconfig at path, or
// with the pod's service account when path is empty (the DaemonSet).
func NewClient(path, userAgent string) (kubernetes.Interface, error) {
	cfg, err := RESTConfig(path, userAgent)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// NewOwnerClient asks about the daemon's own pod's DaemonSet with cfg's
// credentials.
func NewOwnerClient(cfg *rest.Config) (*podowner.Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return podowner.New(hc, cfg.Host)
}

// RESTConfig is NewClient's configuration: the kubeconfig at path, or the
// pod's service account when path is empty.
func RESTConfig(path, userAgent string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if path == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = userAgent
	// Protobuf is smaller and cheaper to decode than JSON for pod lists.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return cfg, nil
}

// RouteKlog sends client-go's own log lines (reflector errors, watch
// restarts) to log, so the daemon writes one log format.
func RouteKlog(log hclog.Logger) {
	klog.SetLogger(funcr.New(func(prefix, args string) {
		log.Debug(args, "source", prefix)
	}, funcr.Options{Verbosity: 2}))
}
