package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/kube"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/server"
	"github.com/nftredir/nftredir/state"
)

// envPrefix starts the environment twin of every flag: --state-dir is
// also NFTREDIR_STATE_DIR. A flag on the command line wins over its twin.
const envPrefix = "NFTREDIR_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// defaultMetricsAddress is every address on defaults.MetricsPort. On a
// hostNetwork DaemonSet the port is the node's.
var defaultMetricsAddress = fmt.Sprintf(":%d", defaults.MetricsPort)

// cmdUninstall is the subcommand that removes the node probe table.
const cmdUninstall = "uninstall"

// options is the parsed and checked command line.
type options struct {
	// command is "" to run the daemon, or cmdUninstall.
	command string
	// version: print the build's version and exit; nothing else is checked.
	version bool

	socket            string
	stateDir          string
	logLevel          string
	logFormat         string
	reconcileInterval time.Duration
	teardownGrace     time.Duration
	allowUIDs         idList
	allowGIDs         idList
	socketGroup       int
	reflection        bool
	shutdownTimeout   time.Duration
	protectNetns      stringList
	metricsAddress    string
	readyFiles        stringList

	zdsSocket      string
	zdsRequireAck  bool
	zdsAllowUIDs   idList
	zdsAllowGIDs   idList
	zdsSocketGroup int
	probeSNAT      bool
	cleanupOnExit  bool
	nodeNetns      string
	kubeletUID     uint32Value

	captureMode  string
	outboundPort portValue
	inboundPort  portValue
	hbonePort    portValue
	dnsPort      portValue
	dnsCapture   bool
	ipv6         bool
	proxyMark    markValue
	tproxyMark   markValue
	routeTable   int
	rulePriority int
	probeV4      addrValue
	probeV6      addrValue
	tproxyV4     addrValue
	tproxyV6     addrValue

	kubernetes bool
	// enrolment is how the runtime hands over new pods: defaults.EnrolmentCNI,
	// EnrolmentNRI or EnrolmentAuto.
	enrolment   string
	nriSocket   string
	nriGateFile string
	takeOver    bool
	kubeconfig  string
	nodeName    string
	// kubeStateDir is where Kubernetes mode kept its records before they
	// moved under stateDir: what is there is moved in at start.
	kubeStateDir string
	// warnings are logged once the logger exists: deprecated flags given.
	warnings     []string
	netnsDirs    stringList
	modeLabel    string
	modeEnabled  string
	modeDisabled string
	// readinessTaint is the NoSchedule taint key removed from the node
	// once the daemon is ready; "" leaves taints alone.
	readinessTaint string
	// podName and podNamespace name the daemon's own pod, whose DaemonSet
	// is asked at a stop whether this is an uninstall.
	podName      string
	podNamespace string
	// uninstallReleasePods: an uninstall releases every captured pod
	// (else it leaves their capture and records in place).
	uninstallReleasePods bool

	// Derived by check.
	spec    nft.Spec
	routing netns.Routing
	level   hclog.Level
}

const usageHead = `nftredird: the nftredir node daemon.

It serves nftredir.v1.RedirectService (plus grpc.health.v1 and reflection)
on a Unix socket and programs pods' network namespaces so their TCP is
captured by the node proxy. It must run as root (CAP_NET_ADMIN and
CAP_SYS_ADMIN at least).

Usage:
  nftredird [flags]             run the daemon
  nftredird uninstall [flags]   remove the node probe table (--node-netns)
                                and nothing else, then exit; a plain stop
                                leaves the table, so kubelet probes keep
                                working while the daemon restarts
  nftredird remove-daemonset --namespace NS --name NAME [--timeout D]
                                delete nftredir's DaemonSet in the
                                foreground and wait for its pods to stop
                                (the Helm chart's pre-delete hook);
                                --help lists its flags

It serves ZDS (the protocol of Istio's node agent) on --zds-socket, so
stock ztunnel gets every enrolled pod's namespace from it. On a
Kubernetes node, --kubelet-uid (or --probe-snat=true) makes it keep a
table in the node's namespace (--node-netns) that SNATs the kubelet's TCP
to enrolled pods to the probe source address, so probes are not captured.
Without either it adds nothing to the node's namespace.

Before serving it checks the kernel (in a scratch namespace of its own)
for every feature its rules use, and stops, naming the missing module, if
one is absent. On --metrics-address it serves HTTP: /healthz (liveness:
the gRPC server answers), /readyz (readiness: startup reconcile done and
every --ready-file present) and /metrics (Prometheus, nftredir_*).

In Kubernetes mode it takes --readiness-taint off its node once it is
ready (as /readyz), and, given its pod (--pod-name, --pod-namespace), a
stop after its DaemonSet was deleted is an uninstall: captured pods are
released (--uninstall-release-pods) and the node probe table removed.

Every flag can also be given as an environment variable: NFTREDIR_ plus
the flag name in upper case with '-' as '_' (--state-dir is
NFTREDIR_STATE_DIR). A flag on the command line wins over the variable.
List flags take comma-separated values.

Flags:
`

func parseFlags(args []string, lookupEnv func(string) (string, bool), out io.Writer) (*options, error) {
	o := &options{
		outboundPort: portValue(defaults.OutboundPort),
		inboundPort:  portValue(defaults.InboundPort),
		hbonePort:    portValue(defaults.HBONEPort),
		dnsPort:      portValue(defaults.DNSPort),
		proxyMark:    markValue{Value: defaults.ProxyMark, Mask: defaults.MarkMask},
		tproxyMark:   markValue{Value: defaults.TProxyMark, Mask: defaults.MarkMask},
		probeV4:      addrValue{defaults.ProbeSourceV4()},
		probeV6:      addrValue{defaults.ProbeSourceV6()},
		tproxyV4:     addrValue{defaults.TProxyAddrV4()},
		tproxyV6:     addrValue{defaults.TProxyAddrV6()},
	}
	// The Downward API's usual variable; NFTREDIR_NODE_NAME still wins.
	nodeNameDefault, _ := lookupEnv("NODE_NAME")
	podNameDefault, _ := lookupEnv("POD_NAME")
	podNamespaceDefault, _ := lookupEnv("POD_NAMESPACE")
	fs := flag.NewFlagSet("nftredird", flag.ContinueOnError)
	// The flag package prints errors and usage itself; keep it quiet and
	// print usage only for -h, so an error is one clear line.
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.socket, "socket", defaults.Socket, "`path` of the Unix socket to serve on; its directory is created 0750 root-owned, the socket is 0660")
	fs.StringVar(&o.stateDir, "state-dir", defaults.StateDir, "`dir`ectory of everything the daemon keeps: the per-pod records and, in Kubernetes mode, under seen/, the namespaces of pods it did not capture and the marks of the annotations it wrote; keep it on tmpfs (/run) so it lives exactly as long as the namespaces it describes")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: trace, debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "log `format`: json or text")
	fs.DurationVar(&o.reconcileInterval, "reconcile-interval", server.DefaultReconcileInterval, "how often every record is checked against its namespace and repaired")
	fs.DurationVar(&o.teardownGrace, "teardown-grace", lifecycle.DefaultTeardownGrace, "how long a namespace whose pod was released for its teardown (CNI DEL) may keep the pod's capture before nftredird removes it itself; runtimes delete it sooner")
	fs.Var(&o.allowUIDs, "allow-uid", "`uids` besides root allowed to call the API (comma list)")
	fs.Var(&o.allowGIDs, "allow-gid", "`gids` allowed to call the API; the caller's primary and supplementary groups as at connect are checked (comma list)")
	fs.IntVar(&o.socketGroup, "socket-group", 0, "`gid` that owns the socket, whose members can connect (they still need --allow-gid or --allow-uid)")
	fs.BoolVar(&o.reflection, "reflection", true, "serve gRPC reflection, so grpcurl works without .proto files")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM/SIGINT, how long running calls may finish before they are cancelled")
	fs.Var(&o.protectNetns, "protect-netns", "extra network namespace `paths` that must never be programmed, besides the daemon's own and PID 1's (comma list)")
	fs.StringVar(&o.metricsAddress, "metrics-address", defaultMetricsAddress, "`host:port` of the HTTP endpoints /healthz (liveness), /readyz (readiness) and /metrics (Prometheus); the default is every address of the node, which kubelet probes on a hostNetwork pod need; empty serves none")
	fs.Var(&o.readyFiles, "ready-file", "`paths` that must exist for /readyz to report ready, e.g. a file the CNI install step writes once the plugin is in place (comma list)")
	fs.StringVar(&o.zdsSocket, "zds-socket", defaults.ZDSSocket, "`path` of the ZDS socket (SOCK_SEQPACKET) ztunnel connects to for pods' namespaces; its directory is created 0750 root-owned, the socket is 0660; empty serves no ZDS")
	fs.Var(&o.zdsAllowUIDs, "zds-allow-uid", "`uids` besides root allowed on the ZDS socket, which hands out every enrolled pod's namespace (comma list); others are dropped before anything is sent")
	fs.Var(&o.zdsAllowGIDs, "zds-allow-gid", "`gids` allowed on the ZDS socket; the caller's primary and supplementary groups as at connect are checked (comma list)")
	fs.IntVar(&o.zdsSocketGroup, "zds-socket-group", 0, "`gid` that owns the ZDS socket and the directory the daemon creates for it, whose members can connect (they still need --zds-allow-gid or --zds-allow-uid)")
	fs.BoolVar(&o.zdsRequireAck, "zds-require-ack", false, "AddPod waits for the node proxy's ZDS ack and returns UNAVAILABLE without one (the pod stays enrolled; the caller retries); needs --zds-socket")
	fs.BoolVar(&o.probeSNAT, "probe-snat", false, "keep the node probe table: the kubelet's TCP to enrolled pods leaves the node from the probe source address, which pods do not capture; on by default when --kubelet-uid is given")
	fs.BoolVar(&o.cleanupOnExit, "cleanup-on-exit", false, "after a clean stop (SIGTERM/SIGINT), remove the node probe table as \"nftredird uninstall\" does; for taking nftredir off the node, not for restarts, which should keep kubelet probes working")
	fs.StringVar(&o.nodeNetns, "node-netns", "", "network namespace `path` of the node, where the probe table lives; empty is the daemon's own; pods naming it are refused like the daemon's own namespace")
	fs.Var(&o.kubeletUID, "kubelet-uid", "`uid` of the kubelet, whose TCP to enrolled pods is SNATed to the probe source; giving it turns --probe-snat on")
	fs.StringVar(&o.captureMode, "capture-mode", defaults.Mode.String(), "default capture `mode` for pods that do not choose: "+defaults.CaptureModeNames())
	fs.Var(&o.outboundPort, "outbound-port", "proxy `port` that captures the pod's outgoing TCP")
	fs.Var(&o.inboundPort, "inbound-port", "proxy `port` that receives incoming plaintext TCP")
	fs.Var(&o.hbonePort, "hbone-port", "proxy `port` that receives incoming HBONE (mTLS tunnel) TCP")
	fs.Var(&o.dnsPort, "dns-port", "proxy `port` that receives captured DNS")
	fs.BoolVar(&o.dnsCapture, "dns-capture", defaults.CaptureDNS, fmt.Sprintf("capture pods' DNS by default (to --dns-port); with --kubernetes the default is %v, as Istio's; pod annotations override", defaults.KubernetesCaptureDNS))
	fs.BoolVar(&o.ipv6, "ipv6", defaults.IPv6, "capture IPv6 as well as IPv4 by default")
	fs.Var(&o.proxyMark, "proxy-mark", "`mark/mask` the proxy sets on its own sockets; such packets are never captured")
	fs.Var(&o.tproxyMark, "tproxy-mark", "`mark/mask` set on tproxied packets; policy routing delivers them locally")
	fs.IntVar(&o.routeTable, "route-table", defaults.RouteTable, "routing `table` for the local route of tproxied packets")
	fs.IntVar(&o.rulePriority, "rule-priority", defaults.RulePriority, "`priority` of the fwmark ip rule")
	fs.Var(&o.probeV4, "probe-source-v4", "kubelet probe source `address` (SNATed on the node) that bypasses capture; empty disables")
	fs.Var(&o.probeV6, "probe-source-v6", "IPv6 kubelet probe source `address`; empty disables")
	fs.BoolVar(&o.version, "version", false, "print the version (module, VCS revision and time, Go version) and exit")
	fs.BoolVar(&o.kubernetes, "kubernetes", false, "Kubernetes mode: watch this node's pods and the namespaces, capture the pods the enrolment policy selects (filling in their identity from the API), enrol and release running pods as their labels change, annotate captured pods")
	fs.StringVar(&o.enrolment, "enrolment", defaults.Enrolment, "Kubernetes mode: how the container runtime hands new pods to the daemon: "+strings.Join(defaults.Enrolments(), ", ")+"; cni: the nftredir-cni plugin chained after the pod network's (an exec per pod; fail-closed on every runtime); nri: the daemon registers as a plugin of the runtime's NRI (--nri-socket) and refuses a runtime whose NRI cannot hold pods back while it is away (containerd before 2.2, CRI-O before 1.34); auto: nri where the runtime can hold pods back, cni elsewhere (docs/nri.md)")
	fs.StringVar(&o.nriSocket, "nri-socket", defaults.NRISocket, "`path` of the container runtime's NRI socket (--enrolment nri or auto)")
	fs.StringVar(&o.nriGateFile, "nri-gate-file", defaults.NRIGateFile, "`file` written once the daemon is registered with a runtime whose NRI validator holds pods back while it is away, and removed when it refuses the runtime: the CNI install step, reading the same setting, takes the plugin out of the networks while it exists (--enrolment nri or auto)")
	fs.BoolVar(&o.takeOver, "take-over-foreign-capture", false, "replace another agent's capture found in a pod's namespace (istio-cni's iptables-nft chains or nftables tables, linkerd's PROXY_INIT_* chains) with ours, in the transaction that installs ours; off, such a pod is refused (FailedPrecondition, and a CaptureRefused Event in Kubernetes mode). Legacy iptables rules are refused either way. Default: on in Kubernetes mode, off otherwise")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig `path` for Kubernetes mode; empty uses the in-cluster service account")
	fs.StringVar(&o.nodeName, "node-name", nodeNameDefault, "this node's `name` in Kubernetes mode (default: $NODE_NAME)")
	fs.StringVar(&o.kubeStateDir, "kubernetes-state-dir", defaults.LegacyKubeStateDir, "deprecated: Kubernetes mode keeps its records under --state-dir now; this names the `dir`ectory where an older daemon kept them, whose files a start in Kubernetes mode moves under --state-dir before removing it (empty: nothing to move)")
	fs.Var(&o.netnsDirs, "netns-dirs", "`dir`ectories where the container runtime pins pod network namespaces, where Kubernetes mode finds running pods it never saw a sandbox of (proven by the pod's IPs); missing ones are skipped; empty turns that off (comma list; default "+strings.Join(defaults.NetnsDirs(), ",")+")")
	fs.StringVar(&o.modeLabel, "dataplane-mode-label", kube.DefaultModeLabel, "label `key` on a namespace or pod that selects capture in Kubernetes mode")
	fs.StringVar(&o.modeEnabled, "dataplane-mode-enabled", kube.DefaultModeEnabled, "label `value` that opts a namespace or pod in")
	fs.StringVar(&o.modeDisabled, "dataplane-mode-disabled", kube.DefaultModeDisabled, "label `value` that opts a pod out even in an opted-in namespace")
	fs.StringVar(&o.readinessTaint, "readiness-taint", kube.DefaultReadinessTaint, "Kubernetes mode: `key` of the NoSchedule taint the daemon removes from its node once it serves, its startup reconcile is done and every --ready-file exists (the CNI plugin is chained); never added back; empty leaves taints alone")
	fs.StringVar(&o.podName, "pod-name", podNameDefault, "Kubernetes mode: this daemon's pod `name` (default: $POD_NAME); with --pod-namespace, a stop asks whether the pod's DaemonSet is being deleted, and if so uninstalls from the node (see --uninstall-release-pods)")
	fs.StringVar(&o.podNamespace, "pod-namespace", podNamespaceDefault, "Kubernetes mode: this daemon's pod `namespace` (default: $POD_NAMESPACE)")
	fs.BoolVar(&o.uninstallReleasePods, "uninstall-release-pods", true, "when the DaemonSet is deleted (uninstall): release every captured pod (their tables and routes, the redirection annotation, the records) and remove the node probe table; false leaves captured pods, their records and the probe table as they are")
	fs.Var(&o.tproxyV4, "tproxy-ipv4", "default `address` TPROXY mode hands inbound TCP to, where the proxy's transparent listeners are looked up (loopback serves loopback-bound and wildcard listeners); empty: none, only wildcard listeners are reached")
	fs.Var(&o.tproxyV6, "tproxy-ipv6", "default IPv6 TPROXY target `address`; empty: none")
	fs.Usage = func() {}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(fs, out)
			}
			return nil, err
		}
		// The subcommand may come before, between or after flags.
		if fs.NArg() > 0 && fs.Arg(0) == cmdUninstall && o.command == "" {
			o.command, args = cmdUninstall, fs.Args()[1:]
			continue
		}
		break
	}
	if o.version {
		return o, nil
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q; nftredird takes flags and the command %q (or %q first, with its own flags)", fs.Args(), cmdUninstall, cmdRemoveDaemonSet)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var envErrs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		v, ok := lookupEnv(envName(f.Name))
		if !ok {
			return
		}
		given[f.Name] = true
		if err := fs.Set(f.Name, v); err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
		}
	})
	if err := errors.Join(envErrs...); err != nil {
		return nil, err
	}
	// The probe table SNATs root's TCP to pods when the kubelet uid is
	// 0: on a node without a kubelet that would let any root process past
	// capture, and the table outlives the daemon. So it exists only when
	// asked for, by a kubelet uid or --probe-snat itself.
	if !given["netns-dirs"] {
		o.netnsDirs = defaults.NetnsDirs()
	}
	if !given["probe-snat"] {
		o.probeSNAT = given["kubelet-uid"]
	}
	// In Kubernetes mode the daemon decides which pods are captured, and
	// a pod istio-cni captured before is one it must take over; a plain
	// daemon only does what its caller asks, and deleting others' rules
	// is not something a caller may expect.
	if !given["take-over-foreign-capture"] {
		o.takeOver = o.kubernetes
	}
	// Kubernetes mode follows Istio, whose pods' DNS goes to ztunnel.
	if o.kubernetes && !given["dns-capture"] {
		o.dnsCapture = defaults.KubernetesCaptureDNS
	}
	// Empty is how a node already moved, or a test, says there is nothing
	// to look for: not a use of the old directory, so no warning.
	if given["kubernetes-state-dir"] && o.kubeStateDir != "" {
		o.warnings = append(o.warnings, "--kubernetes-state-dir is deprecated: Kubernetes mode keeps its records under --state-dir; the directory it names is only moved in at start, and the flag can go once it is gone")
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *options) selector() kube.Selector {
	return kube.Selector{Label: o.modeLabel, Enabled: o.modeEnabled, Disabled: o.modeDisabled}
}

func printUsage(fs *flag.FlagSet, out io.Writer) {
	fmt.Fprint(out, usageHead)
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		fmt.Fprintf(out, "  --%s%s\n    \t%s\n    \t(env %s", f.Name, name, usage, envName(f.Name))
		if f.DefValue != "" {
			fmt.Fprintf(out, "; default %s", f.DefValue)
		}
		fmt.Fprint(out, ")\n")
	})
}

// check validates everything that can be known before touching the system,
// so a bad flag fails with exit 2 before any file or socket exists.
func (o *options) check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !filepath.IsAbs(o.socket) || filepath.Clean(o.socket) != o.socket {
		bad("--socket %q must be an absolute, clean path", o.socket)
	}
	if !filepath.IsAbs(o.stateDir) || filepath.Clean(o.stateDir) != o.stateDir {
		bad("--state-dir %q must be an absolute, clean path", o.stateDir)
	}
	o.level = hclog.LevelFromString(o.logLevel)
	if o.level == hclog.NoLevel || o.level == hclog.Off {
		bad("--log-level %q: use trace, debug, info, warn or error", o.logLevel)
	}
	if o.logFormat != "json" && o.logFormat != "text" {
		bad("--log-format %q: use json or text", o.logFormat)
	}
	if o.reconcileInterval <= 0 {
		bad("--reconcile-interval must be positive")
	}
	if o.teardownGrace <= 0 {
		bad("--teardown-grace must be positive")
	}
	if o.shutdownTimeout <= 0 {
		bad("--shutdown-timeout must be positive")
	}
	if o.socketGroup < 0 {
		bad("--socket-group %d is not a gid", o.socketGroup)
	}
	if o.metricsAddress != "" {
		if _, port, err := net.SplitHostPort(o.metricsAddress); err != nil || port == "" {
			bad("--metrics-address %q: want host:port, e.g. :%d or 127.0.0.1:%[2]d (or empty to serve none)", o.metricsAddress, defaults.MetricsPort)
		}
	}
	if o.zdsSocket != "" && (!filepath.IsAbs(o.zdsSocket) || filepath.Clean(o.zdsSocket) != o.zdsSocket) {
		bad("--zds-socket %q must be an absolute, clean path (or empty to serve no ZDS)", o.zdsSocket)
	}
	if o.zdsSocketGroup < 0 {
		bad("--zds-socket-group %d is not a gid", o.zdsSocketGroup)
	}
	if o.zdsSocket != "" && o.zdsSocket == o.socket {
		bad("--zds-socket and --socket are both %s", o.socket)
	}
	if o.zdsRequireAck && o.zdsSocket == "" {
		bad("--zds-require-ack needs --zds-socket: without ZDS no node proxy can ack")
	}
	if o.nodeNetns != "" && !filepath.IsAbs(o.nodeNetns) {
		bad("--node-netns %q must be an absolute path", o.nodeNetns)
	}
	if o.probeSNAT && o.command == "" && !o.probeV4.IsValid() && !o.probeV6.IsValid() {
		bad("--probe-snat needs a probe source (--probe-source-v4 or --probe-source-v6); or set --probe-snat=false")
	}
	if o.kubernetes {
		if o.nodeName == "" {
			bad("--kubernetes needs --node-name (or NODE_NAME): only this node's pods are watched")
		}
		if o.kubeStateDir != "" && (!filepath.IsAbs(o.kubeStateDir) || filepath.Clean(o.kubeStateDir) != o.kubeStateDir) {
			bad("--kubernetes-state-dir %q must be an absolute, clean path", o.kubeStateDir)
		}
		if o.kubeStateDir != "" && filepath.IsAbs(o.stateDir) {
			if err := state.CheckAdopt(o.kubeStateDir, o.stateDir); err != nil {
				bad("--kubernetes-state-dir: %v", err)
			}
		}
		if err := o.selector().Validate(); err != nil {
			bad("--dataplane-mode-*: %v", err)
		}
		if o.readinessTaint != "" {
			if err := kube.ValidateTaintKey(o.readinessTaint); err != nil {
				bad("--readiness-taint: %v", err)
			}
		}
		if (o.podName == "") != (o.podNamespace == "") {
			bad("--pod-name and --pod-namespace go together (POD_NAME and POD_NAMESPACE from the Downward API)")
		}
	} else {
		if o.kubeconfig != "" {
			bad("--kubeconfig is for Kubernetes mode; add --kubernetes")
		}
		if o.enrolment != defaults.EnrolmentCNI {
			bad("--enrolment %s is for Kubernetes mode, whose policy decides which of the runtime's pods are captured; add --kubernetes", o.enrolment)
		}
	}
	if !slices.Contains(defaults.Enrolments(), o.enrolment) {
		bad("--enrolment %q: use %s", o.enrolment, strings.Join(defaults.Enrolments(), ", "))
	}
	if !filepath.IsAbs(o.nriSocket) || filepath.Clean(o.nriSocket) != o.nriSocket {
		bad("--nri-socket %q must be an absolute, clean path", o.nriSocket)
	}
	if !filepath.IsAbs(o.nriGateFile) || filepath.Clean(o.nriGateFile) != o.nriGateFile {
		bad("--nri-gate-file %q must be an absolute, clean path", o.nriGateFile)
	}
	mode, err := defaults.ParseCaptureMode(o.captureMode)
	if err != nil {
		bad("--capture-mode: %v", err)
	}
	o.spec = nft.Spec{
		PodID:            "flags",
		Mode:             mode,
		OutboundPort:     uint16(o.outboundPort),
		InboundPort:      uint16(o.inboundPort),
		InboundHBONEPort: uint16(o.hbonePort),
		DNSPort:          uint16(o.dnsPort),
		ProxyMark:        nft.Mark(o.proxyMark),
		TProxyMark:       nft.Mark(o.tproxyMark),
		ProbeSourceV4:    o.probeV4.Addr,
		ProbeSourceV6:    o.probeV6.Addr,
		TProxyAddrV4:     o.tproxyV4.Addr,
		TProxyAddrV6:     o.tproxyV6.Addr,
		CaptureDNS:       o.dnsCapture,
		IPv6:             o.ipv6,
	}
	// The DNS port is checked even when DNS capture is off by default,
	// because a pod may turn it on.
	check := o.spec
	check.CaptureDNS = true
	if err == nil {
		if err := check.Validate(); err != nil {
			bad("data-path flags: %v", err)
		}
	}
	o.routing = netns.Routing{Mark: o.tproxyMark.Value, Mask: o.tproxyMark.Mask, Table: o.routeTable, Priority: o.rulePriority}
	if err := o.routing.Validate(); err != nil {
		bad("--route-table/--rule-priority/--tproxy-mark: %v", err)
	}
	return errors.Join(errs...)
}

// uint32Value is a numeric uid.
type uint32Value uint32

func (u *uint32Value) String() string { return strconv.FormatUint(uint64(*u), 10) }

func (u *uint32Value) Set(v string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
	if err != nil {
		return fmt.Errorf("%q is not a numeric id", v)
	}
	*u = uint32Value(n)
	return nil
}

// idList is a comma-separated list of uids or gids.
type idList []uint32

func (l *idList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return strings.Join(s, ",")
}

func (l *idList) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := strconv.ParseUint(part, 10, 32)
		if err != nil {
			return fmt.Errorf("%q is not a numeric id", part)
		}
		*l = append(*l, uint32(n))
	}
	return nil
}

// stringList is a comma-separated (or repeated) list of paths.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			if !filepath.IsAbs(part) {
				return fmt.Errorf("%q is not an absolute path", part)
			}
			*l = append(*l, part)
		}
	}
	return nil
}

type portValue uint16

func (p *portValue) String() string { return strconv.Itoa(int(*p)) }

func (p *portValue) Set(v string) error {
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("%q is not a port (1-65535)", v)
	}
	*p = portValue(n)
	return nil
}

// markValue parses "mark/mask", e.g. "0x539/0xfff" (or a bare value,
// mask 0xffffffff).
type markValue nft.Mark

func (m *markValue) String() string { return fmt.Sprintf("%#x/%#x", m.Value, m.Mask) }

func (m *markValue) Set(v string) error {
	val, mask, hasMask := strings.Cut(v, "/")
	x, err := strconv.ParseUint(val, 0, 32)
	if err != nil {
		return fmt.Errorf("%q: want mark/mask, e.g. %#x/%#x", v, defaults.ProxyMark, defaults.MarkMask)
	}
	y := uint64(0xffffffff)
	if hasMask {
		if y, err = strconv.ParseUint(mask, 0, 32); err != nil {
			return fmt.Errorf("%q: want mark/mask, e.g. %#x/%#x", v, defaults.ProxyMark, defaults.MarkMask)
		}
	}
	*m = markValue{Value: uint32(x), Mask: uint32(y)}
	return nil
}

// addrValue is an IP address; the empty string clears it.
type addrValue struct{ netip.Addr }

func (a *addrValue) String() string {
	if !a.IsValid() {
		return ""
	}
	return a.Addr.String()
}

func (a *addrValue) Set(v string) error {
	if v == "" {
		a.Addr = netip.Addr{}
		return nil
	}
	x, err := netip.ParseAddr(v)
	if err != nil {
		return fmt.Errorf("%q is not an IP address", v)
	}
	a.Addr = x
	return nil
}
