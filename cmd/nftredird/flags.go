package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// envPrefix starts the environment twin of every flag: --state-dir is
// also NFTREDIR_STATE_DIR. A flag on the command line wins over its twin.
const envPrefix = "NFTREDIR_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// cmdUninstall is the subcommand that removes the node probe table.
const cmdUninstall = "uninstall"

// options is the parsed and checked command line.
type options struct {
	// command is "" to run the daemon, or cmdUninstall.
	command string

	socket            string
	stateDir          string
	logLevel          string
	logFormat         string
	reconcileInterval time.Duration
	allowUIDs         idList
	allowGIDs         idList
	socketGroup       int
	reflection        bool
	shutdownTimeout   time.Duration
	protectNetns      stringList

	zdsSocket      string
	zdsRequireAck  bool
	zdsAllowUIDs   idList
	zdsAllowGIDs   idList
	zdsSocketGroup int
	probeSNAT      bool
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

It serves ZDS (the protocol of Istio's node agent) on --zds-socket, so
stock ztunnel gets every enrolled pod's namespace from it, and keeps a
table in the node's namespace (--node-netns) that SNATs the kubelet's TCP
to enrolled pods to the probe source address, so probes are not captured.

Every flag can also be given as an environment variable: NFTREDIR_ plus
the flag name in upper case with '-' as '_' (--state-dir is
NFTREDIR_STATE_DIR). A flag on the command line wins over the variable.
List flags take comma-separated values.

Flags:
`

func parseFlags(args []string, lookupEnv func(string) (string, bool), out io.Writer) (*options, error) {
	o := &options{
		probeSNAT:    true,
		outboundPort: 15001, inboundPort: 15006, hbonePort: 15008, dnsPort: 15053,
		proxyMark:  markValue{Value: 0x539, Mask: 0xfff},
		tproxyMark: markValue{Value: 0x111, Mask: 0xfff},
		probeV4:    addrValue{netip.MustParseAddr("169.254.7.127")},
		probeV6:    addrValue{netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")},
	}
	fs := flag.NewFlagSet("nftredird", flag.ContinueOnError)
	// The flag package prints errors and usage itself; keep it quiet and
	// print usage only for -h, so an error is one clear line.
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.socket, "socket", "/run/nftredir/nftredir.sock", "`path` of the Unix socket to serve on; its directory is created 0750 root-owned, the socket is 0660")
	fs.StringVar(&o.stateDir, "state-dir", "/run/nftredir/pods", "`dir`ectory of the per-pod records; keep it on tmpfs (/run) so it lives exactly as long as the namespaces it describes")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: trace, debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "log `format`: json or text")
	fs.DurationVar(&o.reconcileInterval, "reconcile-interval", 30*time.Second, "how often every record is checked against its namespace and repaired")
	fs.Var(&o.allowUIDs, "allow-uid", "`uids` besides root allowed to call the API (comma list)")
	fs.Var(&o.allowGIDs, "allow-gid", "`gids` allowed to call the API; the caller's primary and supplementary groups as at connect are checked (comma list)")
	fs.IntVar(&o.socketGroup, "socket-group", 0, "`gid` that owns the socket, whose members can connect (they still need --allow-gid or --allow-uid)")
	fs.BoolVar(&o.reflection, "reflection", true, "serve gRPC reflection, so grpcurl works without .proto files")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM/SIGINT, how long running calls may finish before they are cancelled")
	fs.Var(&o.protectNetns, "protect-netns", "extra network namespace `paths` that must never be programmed, besides the daemon's own and PID 1's (comma list)")
	fs.StringVar(&o.zdsSocket, "zds-socket", "/var/run/ztunnel/ztunnel.sock", "`path` of the ZDS socket (SOCK_SEQPACKET) ztunnel connects to for pods' namespaces; its directory is created 0750 root-owned, the socket is 0660; empty serves no ZDS")
	fs.Var(&o.zdsAllowUIDs, "zds-allow-uid", "`uids` besides root allowed on the ZDS socket, which hands out every enrolled pod's namespace (comma list); others are dropped before anything is sent")
	fs.Var(&o.zdsAllowGIDs, "zds-allow-gid", "`gids` allowed on the ZDS socket; the caller's primary and supplementary groups as at connect are checked (comma list)")
	fs.IntVar(&o.zdsSocketGroup, "zds-socket-group", 0, "`gid` that owns the ZDS socket and the directory the daemon creates for it, whose members can connect (they still need --zds-allow-gid or --zds-allow-uid)")
	fs.BoolVar(&o.zdsRequireAck, "zds-require-ack", false, "AddPod waits for the node proxy's ZDS ack and returns UNAVAILABLE without one (the pod stays enrolled; the caller retries); needs --zds-socket")
	fs.BoolVar(&o.probeSNAT, "probe-snat", true, "keep the node probe table: the kubelet's TCP to enrolled pods leaves the node from the probe source address, which pods do not capture")
	fs.StringVar(&o.nodeNetns, "node-netns", "", "network namespace `path` of the node, where the probe table lives; empty is the daemon's own; pods naming it are refused like the daemon's own namespace")
	fs.Var(&o.kubeletUID, "kubelet-uid", "`uid` of the kubelet, whose TCP to enrolled pods is SNATed to the probe source")
	fs.StringVar(&o.captureMode, "capture-mode", "TPROXY", "default capture `mode` for pods that do not choose: TPROXY or REDIRECT")
	fs.Var(&o.outboundPort, "outbound-port", "proxy `port` that captures the pod's outgoing TCP")
	fs.Var(&o.inboundPort, "inbound-port", "proxy `port` that receives incoming plaintext TCP")
	fs.Var(&o.hbonePort, "hbone-port", "proxy `port` that receives incoming HBONE (mTLS tunnel) TCP")
	fs.Var(&o.dnsPort, "dns-port", "proxy `port` that receives captured DNS")
	fs.BoolVar(&o.dnsCapture, "dns-capture", false, "capture pods' DNS by default")
	fs.BoolVar(&o.ipv6, "ipv6", true, "capture IPv6 as well as IPv4 by default")
	fs.Var(&o.proxyMark, "proxy-mark", "`mark/mask` the proxy sets on its own sockets; such packets are never captured")
	fs.Var(&o.tproxyMark, "tproxy-mark", "`mark/mask` set on tproxied packets; policy routing delivers them locally")
	fs.IntVar(&o.routeTable, "route-table", 100, "routing `table` for the local route of tproxied packets")
	fs.IntVar(&o.rulePriority, "rule-priority", 32764, "`priority` of the fwmark ip rule")
	fs.Var(&o.probeV4, "probe-source-v4", "kubelet probe source `address` (SNATed on the node) that bypasses capture; empty disables")
	fs.Var(&o.probeV6, "probe-source-v6", "IPv6 kubelet probe source `address`; empty disables")
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
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q; nftredird takes flags and the one command %q", fs.Args(), cmdUninstall)
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	var envErrs []error
	fs.VisitAll(func(f *flag.Flag) {
		if onCommandLine[f.Name] {
			return
		}
		v, ok := lookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
		}
	})
	if err := errors.Join(envErrs...); err != nil {
		return nil, err
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	return o, nil
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
	if o.shutdownTimeout <= 0 {
		bad("--shutdown-timeout must be positive")
	}
	if o.socketGroup < 0 {
		bad("--socket-group %d is not a gid", o.socketGroup)
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
	mode, err := nft.ParseMode(o.captureMode)
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

// markValue parses "0x539/0xfff" (or a bare value, mask 0xffffffff).
type markValue nft.Mark

func (m *markValue) String() string { return fmt.Sprintf("%#x/%#x", m.Value, m.Mask) }

func (m *markValue) Set(v string) error {
	val, mask, hasMask := strings.Cut(v, "/")
	x, err := strconv.ParseUint(val, 0, 32)
	if err != nil {
		return fmt.Errorf("%q: want mark/mask, e.g. 0x539/0xfff", v)
	}
	y := uint64(0xffffffff)
	if hasMask {
		if y, err = strconv.ParseUint(mask, 0, 32); err != nil {
			return fmt.Errorf("%q: want mark/mask, e.g. 0x539/0xfff", v)
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
