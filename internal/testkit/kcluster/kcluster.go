// Package kcluster starts a real single-node Kubernetes cluster for tests:
// etcd, kube-apiserver (RBAC, ServiceAccount tokens), kube-controller-manager,
// kube-scheduler, containerd + runc and a kubelet, all inside a network
// namespace the test makes (the "node"), so nothing listens in or changes
// the machine's own network namespace. Binaries come from the machine-wide
// cache hack/k8s-tools.sh fills. See README.md for what runs and why each
// odd setting is needed.
package kcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/internal/testkit/testenv"
)

// KubeVersion is the Kubernetes release the cluster runs; hack/k8s-tools.sh
// builds the same (a test checks they agree).
const KubeVersion = "v1.34.4"

// Images the cluster imports itself, built from this repository.
const (
	PauseImage   = "nftredir.test/pause:1"
	StandinImage = "nftredir.test/standin:1"
)

// CNIVersion is the version the cluster's conflist declares unless
// Options.ConflistVersion says otherwise. containerd 2.x (libcni 1.3)
// would accept 1.1.0 too; 1.0.0 is the newest that every runtime
// nftredir-cni runs under loads (containerd 1.6's libcni 1.1 refuses
// 1.1.0), so what passes here holds there.
const CNIVersion = "1.0.0"

// BridgeName is the bridge the CNI bridge plugin makes in the node namespace.
const BridgeName = "kcbr0"

// ConflistName is the one network configuration file in CNIConfDir.
const ConflistName = "10-kcluster.conflist"

const (
	apiPort     = 6443
	etcdPort    = 2379
	startBudget = 3 * time.Minute
)

// Options shape a cluster before it starts.
type Options struct {
	// Repo is the nftredir checkout: the pause and standin images are
	// built from it and the reference CNI plugins (bridge, host-local,
	// loopback) come from its bin/, where hack/deps.sh installs them.
	// Default: the module root above the working directory.
	Repo string
	// ToolsDir holds kube-apiserver, kubelet, ..., etcd, containerd and
	// runc. Default: $NFTREDIR_K8S_BIN, else the cache dir of
	// hack/k8s-tools.sh.
	ToolsDir string
	// RegisterWithTaints are the taints the node carries from its
	// registration (the kubelet's --register-with-taints), as a node
	// pool's startup taints: "key=value:Effect" or "key:Effect".
	RegisterWithTaints []string
	// ConflistVersion is the cniVersion of the node's network, as a
	// primary CNI would write it: "0.3.1" is the version of Flannel's,
	// Calico's, Cilium's and kindnet's default networks. Default:
	// CNIVersion.
	ConflistVersion string
	// ContainerdDebug runs containerd at log level debug, whose lines
	// include each sandbox's CNI setup ("begin cni setup", "cni result"),
	// for a caller that times the CNI chain apart from the rest of
	// RunPodSandbox. Default: info.
	ContainerdDebug bool
	// NRI shapes containerd's Node Resource Interface. Default: on, at
	// Cluster.NRISocket, containerd's own timeouts, no validator, and no
	// plugin until one connects, so pods start as without NRI.
	NRI NRIOptions
}

// NRIOptions shape containerd's NRI. A zero field keeps containerd's own
// default.
type NRIOptions struct {
	// Disable turns NRI off: no socket, no events, no validator.
	Disable bool
	// RequestTimeout is how long containerd waits for a plugin to handle
	// one event (plugin_request_timeout; containerd's default 2 s). A
	// plugin that takes longer is disconnected and the event goes on.
	RequestTimeout time.Duration
	// RegistrationTimeout is how long a connecting plugin has to register
	// and answer its Synchronize (plugin_registration_timeout; containerd's
	// default 5 s).
	RegistrationTimeout time.Duration
	// Validator turns containerd's default validator on. nil: off.
	Validator *NRIValidator
}

// NRIValidator configures containerd's default NRI validator, which runs
// at every CreateContainer.
type NRIValidator struct {
	// RequiredPlugins are plugin names (without their index) that must be
	// connected for any container to be created (required_plugins): with
	// one missing, CreateContainer fails while the pod's sandbox stays,
	// and the kubelet retries. A pod can require more with the
	// "required-plugins.noderesource.dev/pod" annotation.
	RequiredPlugins []string
	// TolerateMissingPluginsAnnotation names an annotation
	// (tolerate_missing_plugins_annotation) with which a pod ("true")
	// starts although a required plugin is missing. "": none.
	TolerateMissingPluginsAnnotation string
}

// Cluster is a running single-node cluster. Its exported fields are fixed
// once Start returns.
type Cluster struct {
	// Dir holds everything the cluster keeps (removed at the end).
	Dir string
	// Netns is the node network namespace; every component runs in it.
	// A node agent under test runs in it too (NodeCommand).
	Netns *nstest.Netns
	// NodeName is the one node's name.
	NodeName string
	// NodeIP is the node's address, on a link in Netns; the apiserver
	// and kubelet serve on it as well as on 127.0.0.1.
	NodeIP netip.Addr
	// PodSubnet is the pod network on the bridge; PodGateway is the
	// bridge's address.
	PodSubnet  netip.Prefix
	PodGateway netip.Addr
	// ServiceSubnet holds Service IPs; only the "kubernetes" Service is
	// reachable (an nft DNAT in the node namespace stands in for
	// kube-proxy), so in-cluster clients find the apiserver.
	ServiceSubnet netip.Prefix
	APIServiceIP  netip.Addr
	// APIServer is the apiserver's URL as seen from the node namespace.
	APIServer string
	// AdminKubeconfig authenticates as a member of system:masters.
	AdminKubeconfig string
	// CAFile is the cluster CA (apiserver serving cert, client certs).
	CAFile string
	// ConflistVersion is the cniVersion WriteConflist declares.
	ConflistVersion string
	// CNIBinDir and CNIConfDir are the CNI directories containerd uses.
	// CNIBinDir has bridge, host-local and loopback; InstallCNIPlugin adds
	// more. CNIConfDir has ConflistName (WriteConflist).
	CNIBinDir, CNIConfDir string
	// ContainerdSocket is the private containerd's API socket.
	ContainerdSocket string
	// NRISocket is where containerd listens for NRI plugins (a short path:
	// unix socket paths stay under 108 bytes). It exists while containerd
	// runs, unless Options.NRI.Disable.
	NRISocket string
	// RESTConfig and Client talk to the apiserver as admin, through a
	// dialer inside the node namespace.
	RESTConfig *rest.Config
	Client     *kubernetes.Clientset

	t         testing.TB
	opts      Options
	repo      string
	tools     string
	pluginSrc string
	etcdDir   string
	runcRoot  string
	pki       *pki
	admin     keyPair

	procs map[string]*proc
	order []string // start order, for teardown and logs

	imgMu    sync.Mutex
	images   map[string]bool
	conflist []byte
}

// Start brings up a cluster and waits until its node is Ready, the
// default ServiceAccount exists and kube-root-ca.crt is published. It is
// torn down when the test ends, even when Start itself fails.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	nstest.RequirePrivileged(t)
	begin := time.Now()
	c := &Cluster{t: t, opts: o, procs: map[string]*proc{}, images: map[string]bool{}, ConflistVersion: o.ConflistVersion}
	if c.ConflistVersion == "" {
		c.ConflistVersion = CNIVersion
	}
	var err error
	if c.repo, err = repoRoot(o.Repo); err != nil {
		t.Fatal(err)
	}
	if c.tools, err = toolsDir(o.ToolsDir); err != nil {
		testenv.Missing(t, "%v", err)
	}
	c.pluginSrc = filepath.Join(c.repo, "bin")
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(c.pluginSrc, p)); err != nil {
			testenv.Missing(t, "CNI plugin %s is missing (%v); run hack/deps.sh (make deps) to build the reference plugins", p, err)
		}
	}
	sweepStale(t, c.tools)
	c.Netns = nstest.NewNetns(t)
	// Short: unix socket paths must stay under 108 bytes.
	if c.Dir, err = os.MkdirTemp("", "kcluster-"); err != nil {
		t.Fatal(err)
	}
	// On tmpfs: etcd fsyncs every write, which costs seconds on a busy disk.
	if c.etcdDir, err = os.MkdirTemp("/dev/shm", "kcluster-etcd-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.teardown)
	if err := c.writeOwner(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	if err := c.start(ctx); err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Logf("cluster %s up in %s (node %s, netns %s)", KubeVersion, time.Since(begin).Round(time.Millisecond), c.NodeName, c.Netns.Name)
	return c
}

// repoRoot finds the module root above the working directory.
func repoRoot(given string) (string, error) {
	if given != "" {
		return filepath.Abs(given)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/nftredir/nftredir\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kcluster: no nftredir checkout above the working directory; set Options.Repo")
		}
		dir = parent
	}
}

// ToolsDir is where hack/k8s-tools.sh leaves the cluster's binaries:
// $NFTREDIR_K8S_BIN, else ${NFTREDIR_TOOLS_CACHE:-/var/cache/nftredir}/k8s-<version>/bin.
func ToolsDir() string {
	if d := os.Getenv("NFTREDIR_K8S_BIN"); d != "" {
		return d
	}
	base := os.Getenv("NFTREDIR_TOOLS_CACHE")
	if base == "" {
		base = "/var/cache/nftredir"
	}
	return filepath.Join(base, "k8s-"+KubeVersion, "bin")
}

func toolsDir(given string) (string, error) {
	dir := given
	if dir == "" {
		dir = ToolsDir()
	}
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "etcd", "containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("kcluster: %s missing in %s; run hack/k8s-tools.sh (or make deps-k8s) to build and cache them once per machine", strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

func (c *Cluster) start(ctx context.Context) error {
	c.NodeName = "kc-" + strings.TrimPrefix(c.Netns.Name, nstest.NamePrefix)
	// The namespace is the test's own, so these never meet the machine's
	// addresses; they only need to differ from each other.
	c.NodeIP = netip.MustParseAddr("10.10.0.2")
	c.PodSubnet = netip.MustParsePrefix("10.10.1.0/24")
	c.PodGateway = netip.MustParseAddr("10.10.1.1")
	c.ServiceSubnet = netip.MustParsePrefix("10.10.2.0/24")
	c.APIServiceIP = netip.MustParseAddr("10.10.2.1")
	c.APIServer = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	c.setPaths()
	for _, d := range []string{c.CNIBinDir, c.CNIConfDir, filepath.Join(c.Dir, "logs"), filepath.Join(c.Dir, "containerd"), c.runcRoot, filepath.Join(c.Dir, "kubelet"),
		filepath.Join(c.Dir, "nri", "plugins"), filepath.Join(c.Dir, "nri", "conf.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// A shared mount: the kubelet runs in a mount namespace of its own
	// (kubeletWrapper), and the volumes it mounts under this directory
	// must show in the machine's, where containerd and runc run.
	if err := unix.Mount(c.Dir, c.Dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", c.Dir, err)
	}
	if err := unix.Mount("", c.Dir, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", c.Dir, err)
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(c.pluginSrc, p), filepath.Join(c.CNIBinDir, p)); err != nil {
			return err
		}
	}
	c.Netns.IPBatch(c.t,
		// A veth pair with both ends here: this kernel may lack the dummy
		// link type.
		"link add node0 type veth peer name node0-peer",
		"link set node0-peer up",
		"link set node0 up",
		"addr add "+c.NodeIP.String()+"/32 dev node0",
		// Components look for "the" host address on the default route.
		"route add default dev node0",
	)
	if err := c.serviceDNAT(); err != nil {
		return err
	}

	var err error
	if c.pki, err = newPKI(filepath.Join(c.Dir, "pki")); err != nil {
		return err
	}
	c.CAFile = c.pki.caPath
	if err := c.writeCredentials(); err != nil {
		return err
	}

	// etcd, containerd and the pause image need nothing of each other.
	if err := c.startEtcd(); err != nil {
		return err
	}
	if err := c.startContainerd(); err != nil {
		return err
	}
	if err := c.imagesDir(); err != nil {
		return err
	}
	pauseTar := make(chan error, 1)
	go func() { pauseTar <- c.buildImage(PauseImage, "pause", "/pause") }()

	if err := c.waitHTTP(ctx, "etcd", fmt.Sprintf("http://127.0.0.1:%d/health", etcdPort), nil); err != nil {
		return err
	}
	if err := c.startAPIServer(); err != nil {
		return err
	}
	if err := c.waitContainerd(ctx); err != nil {
		return err
	}
	if err := <-pauseTar; err != nil {
		return err
	}
	if err := c.importImage(ctx, c.imageTar(PauseImage)); err != nil {
		return err
	}
	if err := c.writeConflist(); err != nil {
		return err
	}
	// The kubelet retries until the apiserver answers, so it starts now.
	if err := c.startKubelet(); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "kube-apiserver", c.APIServer+"/readyz", c.adminTLS()); err != nil {
		return err
	}
	if err := c.startControllers(); err != nil {
		return err
	}
	if err := c.newClient(); err != nil {
		return err
	}
	return c.waitUntil(ctx, "node Ready, default ServiceAccount and kube-root-ca.crt", func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if !nodeReady(n) {
			return false, fmt.Errorf("node %s not Ready", c.NodeName)
		}
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, err
		}
		_, err = c.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, err
	})
}

// setPaths places the cluster's directories and sockets under Dir.
func (c *Cluster) setPaths() {
	c.CNIBinDir = filepath.Join(c.Dir, "cni-bin")
	c.CNIConfDir = filepath.Join(c.Dir, "cni-conf")
	c.ContainerdSocket = filepath.Join(c.Dir, "containerd", "containerd.sock")
	c.NRISocket = filepath.Join(c.Dir, "nri", "nri.sock")
	c.runcRoot = filepath.Join(c.Dir, "runc")
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// serviceDNAT makes the "kubernetes" Service IP reach the apiserver from
// the node namespace and from pods, as kube-proxy would (there is none).
func (c *Cluster) serviceDNAT() error {
	rules := fmt.Sprintf(`table ip kcluster {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %[1]s tcp dport 443 dnat to %[2]s:%[3]d
	}
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr %[1]s tcp dport 443 dnat to %[2]s:%[3]d
	}
}
`, c.APIServiceIP, c.NodeIP, apiPort)
	cmd := c.NodeCommand("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f (service DNAT): %v: %s", err, out)
	}
	return nil
}

// writeCredentials issues every certificate and writes the kubeconfigs.
func (c *Cluster) writeCredentials() error {
	local := []net.IP{net.ParseIP("127.0.0.1"), c.NodeIP.AsSlice(), c.APIServiceIP.AsSlice()}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if _, err := c.pki.issue("apiserver", "kube-apiserver", nil, local, dns); err != nil {
		return err
	}
	if _, err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil); err != nil {
		return err
	}
	if _, _, err := c.pki.serviceAccountKey(); err != nil {
		return err
	}
	var err error
	if c.admin, err = c.pki.issue("admin", "kcluster-admin", []string{"system:masters"}, nil, nil); err != nil {
		return err
	}
	c.AdminKubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.AdminKubeconfig, c.APIServer, c.pki.caPEM, "admin", &c.admin, ""); err != nil {
		return err
	}
	for _, u := range []struct{ file, cn, org string }{
		{"kubelet", "system:node:" + c.NodeName, "system:nodes"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
	} {
		var orgs []string
		if u.org != "" {
			orgs = []string{u.org}
		}
		kp, err := c.pki.issue(u.file, u.cn, orgs, nil, nil)
		if err != nil {
			return err
		}
		if err := writeKubeconfig(filepath.Join(c.Dir, u.file+".kubeconfig"), c.APIServer, c.pki.caPEM, u.file, &kp, ""); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) adminTLS() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.pki.ca)
	cert, err := tls.X509KeyPair(c.admin.certPEM, c.admin.keyPEM)
	if err != nil {
		panic(err) // made by newPKI a moment ago
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}
}

// DialContext dials from inside the node namespace: the socket is made on
// a thread that has entered it, and keeps that namespace afterwards.
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := c.Netns.Do(func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

func (c *Cluster) newClient() error {
	c.RESTConfig = &rest.Config{
		Host: c.APIServer,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.pki.caPEM,
			CertData: c.admin.certPEM,
			KeyData:  c.admin.keyPEM,
		},
		Dial:  c.DialContext,
		QPS:   100,
		Burst: 200,
	}
	var err error
	c.Client, err = kubernetes.NewForConfig(c.RESTConfig)
	return err
}

// Config returns a copy of the admin REST config with the node dialer,
// for clients of other kinds (dynamic, typed for other groups).
func (c *Cluster) Config() *rest.Config { return rest.CopyConfig(c.RESTConfig) }

func (c *Cluster) startComponent(name string, argv ...string) error {
	p, err := startProc(name, c.NodeCommand(argv[0], argv[1:]...), filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return err
	}
	if _, again := c.procs[name]; !again {
		c.order = append(c.order, name)
	}
	c.procs[name] = p
	return nil
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.tools, name) }

func (c *Cluster) startEtcd() error {
	u := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", etcdPort+1)
	return c.startComponent("etcd", c.bin("etcd"),
		"--name=node",
		"--data-dir="+c.etcdDir,
		"--listen-client-urls="+u, "--advertise-client-urls="+u,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=node="+peer,
		"--logger=zap", "--log-outputs=stderr",
		"--snapshot-count=100000",
	)
}

func (c *Cluster) startAPIServer() error {
	pki := c.pki.dir
	return c.startComponent("kube-apiserver", c.bin("kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdPort),
		// All addresses of the node namespace: 127.0.0.1 for the test,
		// the node IP for pods (through the Service DNAT).
		"--bind-address=0.0.0.0",
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--advertise-address="+c.NodeIP.String(),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+c.pki.caPath,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range="+c.ServiceSubnet.String(),
		"--kubelet-client-certificate="+filepath.Join(pki, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+filepath.Join(pki, "apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	)
}

func (c *Cluster) startContainerd() error {
	cfg := filepath.Join(c.Dir, "containerd", "config.toml")
	if err := os.WriteFile(cfg, []byte(c.containerdConfig()), 0o644); err != nil {
		return err
	}
	level := "info"
	if c.opts.ContainerdDebug {
		level = "debug"
	}
	return c.startComponent("containerd", c.bin("containerd"), "--config", cfg, "--log-level", level)
}

func (c *Cluster) startKubelet() error {
	cfg, err := c.kubeletConfig()
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(c.Dir, "kubelet-config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return err
	}
	script, err := c.kubeletWrapper()
	if err != nil {
		return err
	}
	args := []string{"unshare", "--mount", "--propagation", "unchanged", "--",
		"/bin/sh", "-c", script,
		c.bin("kubelet"),
		"--config=" + cfgPath,
		"--kubeconfig=" + filepath.Join(c.Dir, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(c.Dir, "kubelet"),
		"--hostname-override=" + c.NodeName,
		"--node-ip=" + c.NodeIP.String(),
		"--v=2",
	}
	if len(c.opts.RegisterWithTaints) > 0 {
		args = append(args, "--register-with-taints="+strings.Join(c.opts.RegisterWithTaints, ","))
	}
	return c.startComponent("kubelet", args...)
}

func (c *Cluster) startControllers() error {
	pki := c.pki.dir
	if err := c.startComponent("kube-controller-manager", c.bin("kube-controller-manager"),
		"--kubeconfig="+filepath.Join(c.Dir, "controller-manager.kubeconfig"),
		"--authentication-kubeconfig="+filepath.Join(c.Dir, "controller-manager.kubeconfig"),
		"--authorization-kubeconfig="+filepath.Join(c.Dir, "controller-manager.kubeconfig"),
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--root-ca-file="+c.pki.caPath,
		"--cluster-signing-cert-file="+c.pki.caPath,
		"--cluster-signing-key-file="+filepath.Join(pki, "ca.key"),
		"--service-cluster-ip-range="+c.ServiceSubnet.String(),
		"--concurrent-deployment-syncs=2",
		"--v=1",
	); err != nil {
		return err
	}
	return c.startComponent("kube-scheduler", c.bin("kube-scheduler"),
		"--kubeconfig="+filepath.Join(c.Dir, "scheduler.kubeconfig"),
		"--authentication-kubeconfig="+filepath.Join(c.Dir, "scheduler.kubeconfig"),
		"--authorization-kubeconfig="+filepath.Join(c.Dir, "scheduler.kubeconfig"),
		"--secure-port=0",
		"--leader-elect=false",
		"--v=1",
	)
}

// exited reports the first component that has died.
func (c *Cluster) exited() error {
	for _, name := range c.order {
		if err := c.procs[name].exited(); err != nil {
			return fmt.Errorf("%w\n%s", err, c.procs[name].tail(30))
		}
	}
	return nil
}

// waitUntil polls cond every 100ms until it holds, ctx ends or a
// component dies. An error from cond is not fatal: it is reported if the
// wait times out.
func (c *Cluster) waitUntil(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	var last error
	for {
		if err := c.exited(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := cond(cctx)
		cancel()
		if ok && err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s (last error: %v)", what, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitHTTP polls url (in the node namespace) until it answers 200.
func (c *Cluster) waitHTTP(ctx context.Context, what, url string, tlsc *tls.Config) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext, TLSClientConfig: tlsc}, Timeout: 3 * time.Second}
	defer hc.CloseIdleConnections()
	return c.waitUntil(ctx, what, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("%s: %s", url, resp.Status)
		}
		return true, nil
	})
}

// Kubectl runs kubectl as admin inside the node namespace and returns its
// stdout; the test fails on error.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.KubectlErr(nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// KubectlErr runs kubectl as admin with stdin (may be nil) and returns
// its stdout, and an error with its stderr if it failed.
func (c *Cluster) KubectlErr(stdin []byte, args ...string) (string, error) {
	return c.KubectlAs(c.AdminKubeconfig, stdin, args...)
}

// KubectlAs is KubectlErr with another kubeconfig (e.g. one from
// ServiceAccountKubeconfig).
func (c *Cluster) KubectlAs(kubeconfig string, stdin []byte, args ...string) (string, error) {
	cmd := c.NodeCommand(c.bin("kubectl"), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Apply runs `kubectl apply` with args (-f FILE, -k DIR, ...).
func (c *Cluster) Apply(t testing.TB, args ...string) string {
	t.Helper()
	return c.Kubectl(t, append([]string{"apply"}, args...)...)
}

// ApplyYAML applies manifests given as text.
func (c *Cluster) ApplyYAML(t testing.TB, manifest string) string {
	t.Helper()
	out, err := c.KubectlErr([]byte(manifest), "apply", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ToolPath returns the path of one of the cached binaries (kubectl, ctr, ...).
func (c *Cluster) ToolPath(name string) string { return c.bin(name) }

// ComponentLog returns the path of a component's log (etcd,
// kube-apiserver, containerd, kubelet, kube-controller-manager,
// kube-scheduler).
func (c *Cluster) ComponentLog(name string) string { return filepath.Join(c.Dir, "logs", name+".log") }

// runOut runs a command and returns its combined output on error.
func runOut(cmd *exec.Cmd) error {
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
