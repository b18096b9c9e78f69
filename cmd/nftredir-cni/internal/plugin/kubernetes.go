package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/rpc"
	"github.com/nftredir/nftredir/internal/enrolment"
)

// DefaultLookupTimeout bounds the plugin's own reading of the Kubernetes
// API, retries included, when the daemon cannot answer.
const DefaultLookupTimeout = 5 * time.Second

// KubeConf is the entry's "kubernetes" key: what ADD needs to decide by
// itself, when nftredird cannot answer, whether the pod must wait for it
// (docs/blast-radius.md). Without it (standalone mode) every pod outside
// excludeNamespaces waits for the daemon.
type KubeConf struct {
	// Kubeconfig is the JSON kubeconfig "nftredir-cni install" writes
	// and keeps current.
	Kubeconfig string
	// Selector is the daemon's enrolment policy; the installer copies it
	// from the daemon's own settings.
	Selector      enrolment.Selector
	LookupTimeout time.Duration
}

type rawKubeConf struct {
	Kubeconfig    *string `json:"kubeconfig"`
	ModeLabel     *string `json:"modeLabel"`
	ModeEnabled   *string `json:"modeEnabled"`
	ModeDisabled  *string `json:"modeDisabled"`
	LookupTimeout *string `json:"lookupTimeout"`
}

// parseKube reads the "kubernetes" key; absent or null is standalone mode.
func parseKube(msg json.RawMessage) (*KubeConf, []string) {
	if msg == nil || string(msg) == "null" {
		return nil, nil
	}
	var raw rawKubeConf
	d := json.NewDecoder(strings.NewReader(string(msg)))
	d.DisallowUnknownFields()
	if err := d.Decode(&raw); err != nil {
		return nil, []string{fmt.Sprintf("kubernetes: %v (want {\"kubeconfig\": PATH, \"modeLabel\", \"modeEnabled\", \"modeDisabled\", \"lookupTimeout\"})", err)}
	}
	k := &KubeConf{Selector: enrolment.DefaultSelector(), LookupTimeout: DefaultLookupTimeout}
	var errs []string
	if raw.Kubeconfig == nil || !filepath.IsAbs(*raw.Kubeconfig) {
		errs = append(errs, "kubernetes.kubeconfig must be an absolute path (nftredir-cni install writes it)")
	} else {
		k.Kubeconfig = *raw.Kubeconfig
	}
	for _, f := range []struct {
		v   *string
		dst *string
	}{{raw.ModeLabel, &k.Selector.Label}, {raw.ModeEnabled, &k.Selector.Enabled}, {raw.ModeDisabled, &k.Selector.Disabled}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if err := k.Selector.Validate(); err != nil {
		errs = append(errs, "kubernetes: "+err.Error())
	}
	if raw.LookupTimeout != nil {
		t, err := time.ParseDuration(*raw.LookupTimeout)
		if err != nil || t <= 0 {
			errs = append(errs, fmt.Sprintf("kubernetes.lookupTimeout %q is not a positive duration (e.g. \"5s\")", *raw.LookupTimeout))
		} else {
			k.LookupTimeout = t
		}
	}
	return k, errs
}

// cannotAnswer says whether a failed AddPod leaves the decision to the
// plugin: the daemon is not there, out of time, or too busy. An answer
// (a refusal, a fault it classified) is the daemon's decision.
func cannotAnswer(err error) bool {
	switch rpc.CodeOf(err) {
	case rpc.Unavailable, rpc.DeadlineExceeded, rpc.ResourceExhausted, rpc.Aborted, rpc.Canceled:
		return true
	}
	return false
}

// withoutDaemon finishes an ADD that nftredird could not answer, in
// Kubernetes mode: a pod the enrolment policy would not capture starts
// (its result passed through); a pod it would capture fails as before
// (code 11: the runtime retries until the daemon takes it); and when the
// API cannot say which, the pod fails too. See docs/blast-radius.md.
func (p *Plugin) withoutDaemon(r *run, id Identity, prev types.Result, daemonErr error, log hclog.Logger) error {
	fail := daemonError(daemonErr, fmt.Sprintf("enrol pod %s", id.Key), r.conf.Socket)
	k := r.conf.Kube
	if id.Namespace == "" || id.Name == "" {
		fail.Msg += "; the runtime gave no Kubernetes pod (K8S_POD_NAMESPACE, K8S_POD_NAME), so the plugin cannot decide without the daemon"
		return fail
	}
	req := helper.Request{Kubeconfig: k.Kubeconfig, Selector: k.Selector, Namespace: id.Namespace, Name: id.Name, Timeout: k.LookupTimeout}
	if id.Source == KeyPodUID {
		req.UID = id.Key
	}
	begin := time.Now()
	d, err := p.lookup(req)
	log = log.With("lookup", time.Since(begin).Round(time.Millisecond).String())
	switch {
	case err != nil:
		fail.Msg += fmt.Sprintf("; the pod waits: whether the enrolment policy captures it could not be read from the Kubernetes API (%v)", err)
		return fail
	case d.Captured:
		fail.Msg += fmt.Sprintf("; the pod waits: the enrolment policy captures it (%s=%s on the pod or namespace %s)", k.Selector.Label, k.Selector.Enabled, id.Namespace)
		return fail
	}
	log.Info("nftredird cannot answer; starting the pod without it: the enrolment policy does not capture it",
		"reason", d.Why, "daemon", rpc.MessageOf(daemonErr))
	return p.print(prev, r.conf.CNIVersion)
}

// lookup asks nftredir-cni-helper (p.Helper, else the one beside the
// plugin), which reads the pod and its namespace from the API.
func (p *Plugin) lookup(req helper.Request) (helper.Decision, error) {
	path := p.Helper
	if path == "" {
		var err error
		if path, err = helper.Beside(); err != nil {
			return helper.Decision{}, err
		}
	}
	return helper.Ask(context.Background(), path, req)
}
