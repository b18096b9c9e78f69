package kcluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes a kubeconfig for the apiserver at server,
// authenticating with a client certificate or a bearer token.
func writeKubeconfig(path, server string, caPEM []byte, user string, kp *keyPair, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kcluster"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	ai := &clientcmdapi.AuthInfo{Token: token}
	if kp != nil {
		ai.ClientCertificateData, ai.ClientKeyData = kp.certPEM, kp.keyPEM
	}
	cfg.AuthInfos[user] = ai
	cfg.Contexts["kcluster"] = &clientcmdapi.Context{Cluster: "kcluster", AuthInfo: user}
	cfg.CurrentContext = "kcluster"
	return clientcmd.WriteToFile(*cfg, path)
}

// containerdConfig is containerd's whole configuration: everything it
// keeps lives under the cluster's directory, and its CRI plugin uses runc
// with cgroupfs, the locally imported pause image and the cluster's CNI
// dirs; its NRI socket, plugin dirs and default validator are the
// cluster's own. See README.md for why each odd setting is there.
func (c *Cluster) containerdConfig() string {
	q := strconv.Quote
	return fmt.Sprintf(`version = 3
root = %s
state = %s
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.image-verifier.v1.bindir",
]

[grpc]
  address = %s

[ttrpc]
  address = %s

[plugins."io.containerd.internal.v1.opt"]
  path = %s

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %s

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %s
        Root = %s
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%s]
    conf_dir = %s
    max_conf_num = 1

%s`,
		q(filepath.Join(c.Dir, "containerd", "root")),
		q(filepath.Join(c.Dir, "containerd", "state")),
		q(c.ContainerdSocket),
		q(c.ContainerdSocket+".ttrpc"),
		q(filepath.Join(c.Dir, "containerd", "opt")),
		q(PauseImage),
		q(filepath.Join(c.tools, "runc")),
		q(c.runcRoot),
		q(c.CNIBinDir),
		q(c.CNIConfDir),
		c.nriConfig(),
	)
}

// nriConfig is containerd's NRI section: off, or its socket at NRISocket,
// no pre-registered plugins (the dirs it would start them from are the
// cluster's own and empty), and Options.NRI's timeouts and validator.
func (c *Cluster) nriConfig() string {
	const section = `[plugins."io.containerd.nri.v1.nri"]`
	o := c.opts.NRI
	if o.Disable {
		return section + "\n  disable = true\n"
	}
	q := strconv.Quote
	s := fmt.Sprintf(`%s
  disable = false
  socket_path = %s
  plugin_path = %s
  plugin_config_path = %s
`, section, q(c.NRISocket), q(filepath.Join(c.Dir, "nri", "plugins")), q(filepath.Join(c.Dir, "nri", "conf.d")))
	if o.RequestTimeout > 0 {
		s += fmt.Sprintf("  plugin_request_timeout = %s\n", q(o.RequestTimeout.String()))
	}
	if o.RegistrationTimeout > 0 {
		s += fmt.Sprintf("  plugin_registration_timeout = %s\n", q(o.RegistrationTimeout.String()))
	}
	if v := o.Validator; v != nil {
		required := make([]string, len(v.RequiredPlugins))
		for i, p := range v.RequiredPlugins {
			required[i] = q(p)
		}
		s += fmt.Sprintf(`  [plugins."io.containerd.nri.v1.nri".default_validator]
    enable = true
    required_plugins = [%s]
    tolerate_missing_plugins_annotation = %s
`, strings.Join(required, ", "), q(v.TolerateMissingPluginsAnnotation))
	}
	return s
}

// kubeletConfig is the KubeletConfiguration; README.md says why.
func (c *Cluster) kubeletConfig() ([]byte, error) {
	cfg := map[string]any{
		"apiVersion":         "kubelet.config.k8s.io/v1beta1",
		"kind":               "KubeletConfiguration",
		"address":            "0.0.0.0",
		"port":               10250,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        10248,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": c.pki.caPath},
		},
		"authorization":                   map[string]any{"mode": "AlwaysAllow"},
		"containerRuntimeEndpoint":        "unix://" + c.ContainerdSocket,
		"cgroupDriver":                    "cgroupfs",
		"cgroupsPerQOS":                   false,
		"failCgroupV1":                    false,
		"enforceNodeAllocatable":          []string{},
		"failSwapOn":                      false,
		"makeIPTablesUtilChains":          false,
		"localStorageCapacityIsolation":   false,
		"oomScoreAdj":                     0,
		"podLogsDir":                      filepath.Join(c.Dir, "pod-logs"),
		"volumePluginDir":                 filepath.Join(c.Dir, "kubelet-volume-plugins"),
		"evictionHard":                    map[string]string{},
		"imageGCHighThresholdPercent":     100,
		"imageGCLowThresholdPercent":      99,
		"serializeImagePulls":             false,
		"rotateCertificates":              false,
		"serverTLSBootstrap":              false,
		"nodeStatusUpdateFrequency":       "4s",
		"nodeStatusReportFrequency":       "10s",
		"syncFrequency":                   "10s",
		"fileCheckFrequency":              "20s",
		"runtimeRequestTimeout":           "2m",
		"resolvConf":                      "",
		"shutdownGracePeriod":             "0s",
		"shutdownGracePeriodCriticalPods": "0s",
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// kernelTunables are the sysctls the kubelet sets at start when they
// differ (vm.overcommit_memory=1, kernel.panic=10, ...). They are global,
// not per network namespace: the kubelet sees files with these values in
// its own mount namespace instead, so the machine's stay as they are.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletWrapper is the shell run as the kubelet's first process: in a
// mount namespace of its own (whose cluster directory still propagates to
// and from the machine's, so the volumes it mounts reach containerd) it
// covers the kernel tunables and /var/log/containers, then execs the
// kubelet ("$0" "$@").
func (c *Cluster) kubeletWrapper() (string, error) {
	dir := filepath.Join(c.Dir, "kubelet-sysctl")
	script := "set -e\n"
	for k, v := range kernelTunables {
		f := filepath.Join(dir, filepath.Base(k))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			return "", err
		}
		script += fmt.Sprintf("mount --bind %s /proc/sys/%s\n", strconv.Quote(f), k)
	}
	// The kubelet links container logs there for log shippers; here it
	// would leave links in the machine's /var/log.
	logs := filepath.Join(c.Dir, "var-log-containers")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return "", err
	}
	script += fmt.Sprintf("if [ -d /var/log/containers ]; then mount --bind %s /var/log/containers; fi\n", strconv.Quote(logs))
	script += `exec "$0" "$@"` + "\n"
	return script, nil
}

// BridgePlugin is the primary CNI plugin of the cluster's network: a
// bridge in the node namespace, host-local addresses from the pod subnet,
// no masquerade (it would program iptables, and nothing here leaves the
// node namespace).
func (c *Cluster) BridgePlugin() map[string]any {
	return map[string]any{
		"type":        "bridge",
		"bridge":      BridgeName,
		"isGateway":   true,
		"ipMasq":      false,
		"hairpinMode": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": filepath.Join(c.Dir, "ipam"),
			"ranges": [][]map[string]string{{{
				"subnet":  c.PodSubnet.String(),
				"gateway": c.PodGateway.String(),
			}}},
			"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
		},
	}
}
