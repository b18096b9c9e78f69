package install

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/enrolment"
	"github.com/nftredir/nftredir/internal/podowner"
)

// The subcommands, nftredir-cni-helper's (internal/helper).
const (
	CmdInstall   = helper.Install
	CmdUninstall = helper.Uninstall
)

// envPrefix starts each flag's environment twin: --cni-bin-dir is
// NFTREDIR_CNI_BIN_DIR, --socket is NFTREDIR_CNI_SOCKET.
const envPrefix = "NFTREDIR_CNI_"

func envName(flagName string) string {
	if v, ok := daemonEnv[flagName]; ok {
		return v
	}
	return envPrefix + strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(flagName, "cni-"), "-", "_"))
}

// daemonEnv are the flags whose twin is nftredird's own variable, not an
// NFTREDIR_CNI_ one: the enrolment policy the plugin applies when the
// daemon cannot answer must be the daemon's, so one setting (a ConfigMap
// key both containers read) sets both. nftredird's flags of the same
// names read the same variables.
var daemonEnv = map[string]string{
	"kubernetes":              "NFTREDIR_KUBERNETES",
	"dataplane-mode-label":    "NFTREDIR_DATAPLANE_MODE_LABEL",
	"dataplane-mode-enabled":  "NFTREDIR_DATAPLANE_MODE_ENABLED",
	"dataplane-mode-disabled": "NFTREDIR_DATAPLANE_MODE_DISABLED",
	// How the runtime hands pods over is the daemon's setting too: with
	// NRI the plugin is chained only until the daemon has a gate.
	"enrolment":     "NFTREDIR_ENROLMENT",
	"nri-gate-file": "NFTREDIR_NRI_GATE_FILE",
}

const usage = `nftredir-cni install [flags]: put the plugin on this node and keep it there.

Copies this binary into each existing --cni-bin-dir (atomically), chains
the plugin's entry into the network the runtime uses (the first file of
--cni-conf-dir in lexical order, or --cni-conf-name) with that network's
cniVersion, then watches the directory and chains it again whenever the
primary CNI rewrites the file. A single-plugin .conf becomes a .conflist.
While the plugin is not in place it is not ready: --ready-file is absent,
and "install --check" fails. On SIGTERM it leaves everything in place, so
a restart or an update of the installer never lets pods start
uncaptured, unless --cleanup-on-exit is set, or, in a Kubernetes pod
(--pod-name and --pod-namespace, from the Downward API), the pod's
DaemonSet is gone or being deleted: that is an uninstall, and it removes
the plugin as "nftredir-cni uninstall" does.

nftredir-cni install --once [flags]: install (or repair) once and exit.
nftredir-cni install --check [flags]: exit 0 if installed; changes nothing.
nftredir-cni uninstall [flags]: remove the entry from every network of
--cni-conf-dir, then the binary from every --cni-bin-dir.

Every flag but --once and --check has an environment twin: NFTREDIR_CNI_
plus the flag name without "cni-", upper case, '-' as '_' (--cni-bin-dir
is NFTREDIR_CNI_BIN_DIR). A flag on the command line wins over its twin.
--kubernetes and --dataplane-mode-* are twinned with nftredird's own
variables instead (NFTREDIR_KUBERNETES, NFTREDIR_DATAPLANE_MODE_LABEL,
..._ENABLED, ..._DISABLED), so that the plugin applies the daemon's
enrolment policy when the daemon cannot answer.

In Kubernetes mode the installer also writes --kubeconfig-name into
--cni-conf-dir (mode 0600) from the service account's token and CA, and
rewrites it whenever the kubelet rotates the token; the entry's
"kubernetes" key names it (docs/blast-radius.md).

Flags:
`

// modeFlags choose what the command does rather than how; they have no
// environment twin, so a variable shared by a DaemonSet's containers can
// never turn the watching installer into a one-shot or a check.
var modeFlags = map[string]bool{"once": true, "check": true}

type options struct {
	binDirs       listValue
	confDir       string
	confName      string
	pluginConfig  string
	pluginBinary  string
	socket        string
	timeout       time.Duration
	excludeNS     listValue
	logFile       string
	logLevel      string
	readyFile     string
	backupDir     string
	cleanupOnExit bool
	podName       string
	podNamespace  string
	once          bool
	check         bool
	resync        time.Duration
	verbosity     string

	enrolment   string
	nriGateFile string

	kubernetes     bool
	modeLabel      string
	modeEnabled    string
	modeDisabled   string
	kubeconfigName string
	confDirOnHost  string
	tokenFile      string
	caFile         string
	kubeServer     string
}

// Main runs the install or uninstall subcommand (args after it) and
// returns the exit code: 0 done, 1 failed, 2 bad flags.
func Main(command string, args []string, lookupEnv func(string) (string, bool), supported []string, stderr io.Writer) int {
	opts, cfg, err := parse(command, args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nftredir-cni %s: %v\n", command, err)
		return 2
	}
	cfg.Supported = supported
	log := hclog.New(&hclog.LoggerOptions{Name: "nftredir-cni-" + command, Output: stderr, Level: hclog.LevelFromString(opts.verbosity), TimeFormat: time.RFC3339Nano})
	cfg.Logger = log
	if opts.check {
		if err := Check(cfg); err != nil {
			fmt.Fprintf(stderr, "nftredir-cni: not installed: %v\n", err)
			return 1
		}
		return 0
	}
	in, err := New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "nftredir-cni %s: %v\n", command, err)
		return 2
	}
	if command == CmdUninstall {
		if err := in.Uninstall(); err != nil {
			log.Error("uninstall incomplete", "error", err)
			return 1
		}
		log.Info("uninstalled")
		return 0
	}
	if opts.once {
		if err := in.Sync(); err != nil {
			log.Error("plugin not installed", "error", err)
			return 1
		}
		log.Info("installed", "conf_dir", cfg.ConfDir, "bin_dirs", cfg.BinDirs)
		return 0
	}
	// Past the signal: the DaemonSet's deletion may arrive just after it.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	owner := watchOwner(watchCtx, opts, lookupEnv, log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("installing and watching", "conf_dir", cfg.ConfDir, "conf_name", cfg.ConfName, "bin_dirs", cfg.BinDirs, "cleanup_on_exit", opts.cleanupOnExit)
	runErr := in.Run(ctx, opts.resync)
	if runErr != nil {
		log.Error("watching stopped", "error", runErr)
	}
	cleanup := opts.cleanupOnExit
	if !cleanup {
		cleanup = daemonSetDeleted(owner, log)
	}
	if cleanup {
		if err := in.Uninstall(); err != nil {
			log.Error("cleanup on exit incomplete", "error", err)
			return 1
		}
		log.Info("cleaned up on exit")
	} else if in.cfg.ReadyFile != "" {
		// The plugin stays; only this process's readiness ends with it.
		if err := os.Remove(in.cfg.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("cannot remove the ready file", "error", err)
		}
	}
	if runErr != nil {
		return 1
	}
	return 0
}

// ownerCheckTimeout bounds the question at SIGTERM; the DaemonSet's
// grace period is 30s.
const ownerCheckTimeout = 10 * time.Second

// watchOwner starts following this pod's DaemonSet, when the pod is
// known, so that its deletion is seen while the pod may still read it.
// nil when there is nothing to follow (logged).
func watchOwner(ctx context.Context, opts *options, lookupEnv func(string) (string, bool), log hclog.Logger) *podowner.Watcher {
	if opts.podName == "" {
		return nil
	}
	c, err := podowner.InCluster(podowner.ServiceAccountDir, lookupEnv)
	if err != nil {
		log.Warn("cannot follow the DaemonSet; a stop will leave the plugin in place", "error", err)
		return nil
	}
	return c.Watch(ctx, opts.podNamespace, opts.podName, func(msg string, kv ...any) { log.Warn(msg, kv...) })
}

// daemonSetDeleted tells whether this pod's DaemonSet is gone or being
// deleted. Anything else, an API that cannot be reached included, is a
// restart or an update: the plugin stays.
func daemonSetDeleted(w *podowner.Watcher, log hclog.Logger) bool {
	if w == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), ownerCheckTimeout)
	defer cancel()
	v, why, err := w.Verdict(ctx)
	switch {
	case v == podowner.Deleted:
		log.Info("DaemonSet deleted: uninstalling the plugin", "why", why)
		return true
	case err != nil:
		log.Warn("cannot tell whether the DaemonSet is being deleted; the plugin stays", "error", err)
	default:
		log.Info("not an uninstall; the plugin stays", "why", why)
	}
	return false
}

func parse(command string, args []string, lookupEnv func(string) (string, bool), out io.Writer) (*options, Config, error) {
	o := &options{
		binDirs:   listValue{items: []string{"/opt/cni/bin", "/usr/lib/cni"}},
		excludeNS: listValue{items: []string{"kube-system"}},
	}
	// The Downward API's usual variables; the NFTREDIR_CNI_ twins win.
	podName, _ := lookupEnv("POD_NAME")
	podNamespace, _ := lookupEnv("POD_NAMESPACE")
	fs := flag.NewFlagSet("nftredir-cni "+command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.Var(&o.binDirs, "cni-bin-dir", "CNI binary `dirs` to copy the plugin into, each that exists (comma list or repeated; the first use replaces the default)")
	fs.StringVar(&o.confDir, "cni-conf-dir", "/etc/cni/net.d", "the runtime's CNI configuration `dir`")
	fs.StringVar(&o.confName, "cni-conf-name", "", "network `file` in --cni-conf-dir to chain into; empty: the first .conf, .conflist or .json in lexical order, as the runtimes pick it")
	fs.StringVar(&o.pluginBinary, "plugin-binary", "", "the nftredir-cni `file` to install; empty: the one beside this program")
	fs.StringVar(&o.pluginConfig, "plugin-config", "", "JSON `file` holding the plugin's entry (see docs/cni.md); the flags below that are given override its keys")
	fs.StringVar(&o.socket, "socket", defaults.Socket, "entry key socket: the daemon's socket `path`")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "entry key timeout: bound on each call to the daemon")
	fs.Var(&o.excludeNS, "exclude-namespaces", "entry key excludeNamespaces: Kubernetes `namespaces` whose pods are not enrolled (comma list; empty for none)")
	fs.StringVar(&o.logFile, "log-file", "", "entry key logFile: the plugin's log `file`; empty logs to the runtime's stderr")
	fs.StringVar(&o.logLevel, "log-level", "", "entry key logLevel: the plugin's log `level`; empty is the plugin's default (info)")
	fs.StringVar(&o.readyFile, "ready-file", "", "`file` that exists exactly while the plugin is installed")
	fs.StringVar(&o.backupDir, "backup-dir", "", "`dir`ectory where each network file is kept as it was before the plugin was chained, so that uninstall restores its exact bytes; empty: uninstall re-encodes the file without the entry")
	fs.BoolVar(&o.cleanupOnExit, "cleanup-on-exit", false, "on SIGTERM, uninstall before exiting (for removing nftredir from the node, not for restarts)")
	fs.StringVar(&o.podName, "pod-name", podName, "this installer's pod `name` (default: $POD_NAME); with --pod-namespace, SIGTERM asks the API whether the pod's DaemonSet is gone or being deleted, and if so uninstalls (the ServiceAccount needs get on pods and daemonsets.apps)")
	fs.StringVar(&o.podNamespace, "pod-namespace", podNamespace, "this installer's pod `namespace` (default: $POD_NAMESPACE)")
	fs.DurationVar(&o.resync, "resync-interval", time.Minute, "check the installation this often even without a file event")
	fs.StringVar(&o.verbosity, "verbosity", "info", "this command's own log `level`")
	fs.StringVar(&o.enrolment, "enrolment", defaults.Enrolment, "nftredird's --enrolment, read from the same variable: "+strings.Join(defaults.Enrolments(), ", ")+"; with nri or auto the plugin is chained only until --nri-gate-file exists, then taken out of every network (docs/nri.md)")
	fs.StringVar(&o.nriGateFile, "nri-gate-file", defaults.NRIGateFile, "nftredird's --nri-gate-file: the `file` the daemon writes once the runtime's NRI validator holds pods back for it")
	fs.BoolVar(&o.kubernetes, "kubernetes", false, "Kubernetes mode, as nftredird's --kubernetes: write a kubeconfig for the plugin and the entry key kubernetes, so that when the daemon cannot answer, a pod the enrolment policy would not capture starts without it (docs/blast-radius.md)")
	fs.StringVar(&o.modeLabel, "dataplane-mode-label", enrolment.DefaultModeLabel, "entry key kubernetes.modeLabel: nftredird's --dataplane-mode-label, read from the same variable")
	fs.StringVar(&o.modeEnabled, "dataplane-mode-enabled", enrolment.DefaultModeEnabled, "entry key kubernetes.modeEnabled: nftredird's --dataplane-mode-enabled")
	fs.StringVar(&o.modeDisabled, "dataplane-mode-disabled", enrolment.DefaultModeDisabled, "entry key kubernetes.modeDisabled: nftredird's --dataplane-mode-disabled")
	fs.StringVar(&o.kubeconfigName, "kubeconfig-name", DefaultKubeconfigName, "`file` name of the plugin's kubeconfig in --cni-conf-dir (Kubernetes mode)")
	fs.StringVar(&o.confDirOnHost, "cni-conf-dir-on-host", "", "the runtime's CNI configuration `dir` as the plugin (on the host) sees it, for the kubeconfig's path in the entry; empty: --cni-conf-dir")
	fs.StringVar(&o.tokenFile, "kube-token-file", DefaultTokenFile, "service account token `file` copied into the plugin's kubeconfig, again whenever it changes")
	fs.StringVar(&o.caFile, "kube-ca-file", DefaultCAFile, "the cluster's CA bundle `file` for the plugin's kubeconfig")
	fs.StringVar(&o.kubeServer, "kube-server", "", "the Kubernetes API's https `URL` as the node reaches it; empty: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT")
	if command == CmdInstall {
		fs.BoolVar(&o.once, "once", false, "install or repair once, then exit instead of watching")
		fs.BoolVar(&o.check, "check", false, "exit 0 if the plugin is installed as configured, 1 if not; change nothing")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(out, usage)
			fs.VisitAll(func(f *flag.Flag) {
				name, u := flag.UnquoteUsage(f)
				if name != "" {
					name = " " + name
				}
				if modeFlags[f.Name] {
					fmt.Fprintf(out, "  --%s%s\n    \t%s\n", f.Name, name, u)
					return
				}
				fmt.Fprintf(out, "  --%s%s\n    \t%s\n    \t(env %s; default %q)\n", f.Name, name, u, envName(f.Name), f.DefValue)
			})
		}
		return nil, Config{}, err
	}
	if fs.NArg() > 0 {
		return nil, Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || modeFlags[f.Name] {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
			given[f.Name] = true
		}
	})
	if o.resync <= 0 {
		errs = append(errs, errors.New("--resync-interval must be positive"))
	}
	if o.timeout <= 0 {
		errs = append(errs, errors.New("--timeout must be positive"))
	}
	if (o.podName == "") != (o.podNamespace == "") {
		errs = append(errs, errors.New("--pod-name and --pod-namespace go together (POD_NAME and POD_NAMESPACE from the Downward API)"))
	}
	if !slices.Contains(defaults.Enrolments(), o.enrolment) {
		errs = append(errs, fmt.Errorf("--enrolment %q: use %s", o.enrolment, strings.Join(defaults.Enrolments(), ", ")))
	}
	if o.once && o.check {
		errs = append(errs, errors.New("--once and --check exclude each other"))
	}
	if l := hclog.LevelFromString(o.verbosity); l == hclog.NoLevel || l == hclog.Off {
		errs = append(errs, fmt.Errorf("--verbosity %q: use trace, debug, info, warn or error", o.verbosity))
	}
	var kube *Kubeconfig
	if o.kubernetes {
		if o.kubeServer == "" {
			o.kubeServer = serverFromEnv(lookupEnv)
		}
		if o.kubeconfigName == "" || filepath.Base(o.kubeconfigName) != o.kubeconfigName {
			errs = append(errs, fmt.Errorf("--kubeconfig-name %q must be a file name", o.kubeconfigName))
		}
		if o.confDirOnHost == "" {
			o.confDirOnHost = o.confDir
		}
		if !filepath.IsAbs(o.confDirOnHost) {
			errs = append(errs, fmt.Errorf("--cni-conf-dir-on-host %q is not an absolute path", o.confDirOnHost))
		}
		sel := enrolment.Selector{Label: o.modeLabel, Enabled: o.modeEnabled, Disabled: o.modeDisabled}
		if err := sel.Validate(); err != nil {
			errs = append(errs, err)
		}
		kube = &Kubeconfig{Path: filepath.Join(o.confDir, o.kubeconfigName), TokenFile: o.tokenFile, CAFile: o.caFile, Server: o.kubeServer}
	}
	entry, err := o.entry(given)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, Config{}, err
	}
	cfg := Config{BinDirs: o.binDirs.items, ConfDir: o.confDir, ConfName: o.confName, Entry: entry, Source: o.pluginBinary, ReadyFile: o.readyFile, BackupDir: o.backupDir, Kubeconfig: kube}
	if o.enrolment != defaults.EnrolmentCNI {
		cfg.NRIGateFile = o.nriGateFile
	}
	if err := cfg.check(); err != nil {
		return nil, Config{}, err
	}
	return o, cfg, nil
}

// entry builds the plugin's entry: the --plugin-config file (or the
// defaults), with the keys of the flags given on top.
func (o *options) entry(given map[string]bool) (json.RawMessage, error) {
	e := map[string]any{}
	fromFile := o.pluginConfig != ""
	if fromFile {
		raw, err := os.ReadFile(o.pluginConfig)
		if err != nil {
			return nil, fmt.Errorf("--plugin-config: %w", err)
		}
		if err := json.Unmarshal(raw, &e); err != nil || e == nil {
			return nil, fmt.Errorf("--plugin-config %s: not a JSON object", o.pluginConfig)
		}
		if t, ok := e["type"]; ok && t != PluginType {
			return nil, fmt.Errorf("--plugin-config %s: type %v, want %q", o.pluginConfig, t, PluginType)
		}
		// A drop-in (deploy/cni/99-nftredir.conf) may carry these; in a
		// conflist they belong to the list.
		delete(e, "cniVersion")
		delete(e, "name")
	}
	e["type"] = PluginType
	set := func(flagName, key string, v any) {
		if !fromFile || given[flagName] {
			e[key] = v
		}
	}
	if !filepath.IsAbs(o.socket) {
		return nil, fmt.Errorf("--socket %q is not an absolute path", o.socket)
	}
	set("socket", "socket", o.socket)
	set("timeout", "timeout", o.timeout.String())
	set("exclude-namespaces", "excludeNamespaces", nonNil(o.excludeNS.items))
	if o.logFile != "" {
		if !filepath.IsAbs(o.logFile) {
			return nil, fmt.Errorf("--log-file %q is not an absolute path", o.logFile)
		}
		set("log-file", "logFile", o.logFile)
	}
	if o.logLevel != "" {
		set("log-level", "logLevel", o.logLevel)
	}
	if o.kubernetes {
		// The daemon's policy, from the daemon's own settings, over
		// whatever the --plugin-config file has; its lookupTimeout stays.
		k, _ := e["kubernetes"].(map[string]any)
		if k == nil {
			k = map[string]any{}
		}
		k["kubeconfig"] = filepath.Join(o.confDirOnHost, o.kubeconfigName)
		k["modeLabel"], k["modeEnabled"], k["modeDisabled"] = o.modeLabel, o.modeEnabled, o.modeDisabled
		e["kubernetes"] = k
	} else {
		delete(e, "kubernetes")
	}
	return json.Marshal(e)
}

// listValue is a comma-separated or repeated list. The first Set replaces
// the default rather than adding to it.
type listValue struct {
	items []string
	set   bool
}

func (l *listValue) String() string { return strings.Join(l.items, ",") }

func (l *listValue) Set(v string) error {
	if !l.set {
		l.items, l.set = nil, true
	}
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			l.items = append(l.items, part)
		}
	}
	return nil
}

// nonNil makes an empty list encode as [], not null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
