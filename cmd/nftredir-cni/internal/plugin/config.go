package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/rpc"
	"github.com/nftredir/nftredir/internal/defaults"
)

// Defaults of the plugin's own settings. Capture options have none here:
// an unset option is sent unset and the daemon applies its default, so that
// one place (the daemon's flags) decides the node's policy.
const (
	DefaultTimeout  = 10 * time.Second
	DefaultDataDir  = "/var/lib/cni/nftredir"
	DefaultLogLevel = "info"
)

// Keys under which the runtime lists the attachments GC must keep. The
// spec renamed the first to the second after 1.1.0 was tagged; runtimes
// with libcni >= 1.2.3 send both.
const (
	keyValidAttachments    = "cni.dev/valid-attachments"
	keyValidAttachmentsOld = "cni.dev/attachments"
)

// Conf is the plugin's network configuration: the standard keys, what the
// runtime injects, and the keys documented in docs/cni.md.
type Conf struct {
	types.PluginConf

	// Socket is the daemon's Unix socket.
	Socket string
	// Timeout bounds the plugin's whole conversation with the daemon.
	Timeout time.Duration
	// DataDir holds the plugin's attachment records (see attachments.go).
	DataDir string
	// ExcludeNamespaces are Kubernetes namespaces whose pods are passed
	// through without being enrolled.
	ExcludeNamespaces []string
	LogFile           string
	LogLevel          hclog.Level

	// Options is what AddPod asks for; nil fields are left to the daemon.
	// Only parsed for ADD (see ParseConf).
	Options *rpc.Options

	// ValidAttachments is the union of both GC keys.
	ValidAttachments []types.GCAttachment

	// Kube is the "kubernetes" key (kubernetes.go); nil in standalone
	// mode.
	Kube *KubeConf
}

// rawConf is the JSON shape of the plugin's own keys. Options are kept
// raw so that DEL, CHECK, STATUS and GC can ignore a malformed option
// instead of failing: a pod must stay deletable after someone breaks an
// option that only ADD uses.
type rawConf struct {
	Socket            *string  `json:"socket"`
	Timeout           *string  `json:"timeout"`
	DataDir           *string  `json:"dataDir"`
	ExcludeNamespaces []string `json:"excludeNamespaces"`
	LogFile           *string  `json:"logFile"`
	LogLevel          *string  `json:"logLevel"`

	CaptureMode          json.RawMessage `json:"captureMode"`
	ExcludeInboundPorts  json.RawMessage `json:"excludeInboundPorts"`
	ExcludeOutboundPorts json.RawMessage `json:"excludeOutboundPorts"`
	ExcludeOutboundCIDRs json.RawMessage `json:"excludeOutboundCIDRs"`
	DNSCapture           json.RawMessage `json:"dnsCapture"`
	IPv6                 json.RawMessage `json:"ipv6"`
	InboundCapture       json.RawMessage `json:"inboundCapture"`
	RerouteInterfaces    json.RawMessage `json:"rerouteVirtualInterfaces"`
	Kubernetes           json.RawMessage `json:"kubernetes"`

	ValidAttachments    json.RawMessage `json:"cni.dev/valid-attachments"`
	ValidAttachmentsOld json.RawMessage `json:"cni.dev/attachments"`
}

// knownKeys are the top-level keys the plugin expects to see: its own, the
// standard ones and those runtimes inject. Others are logged, not refused:
// the spec lets runtimes add keys, and a pod must not fail to start
// because a newer runtime sends one.
var knownKeys = []string{
	"cniVersion", "cniVersions", "name", "type", "capabilities", "ipam", "dns",
	"args", "runtimeConfig", "prevResult",
	"socket", "timeout", "dataDir", "excludeNamespaces", "logFile", "logLevel",
	"captureMode", "excludeInboundPorts", "excludeOutboundPorts", "excludeOutboundCIDRs",
	"dnsCapture", "ipv6", "inboundCapture", "rerouteVirtualInterfaces", "kubernetes",
}

// maxExclusions mirrors the daemon's request limits loosely; the daemon
// enforces the real ones. It only stops a runaway config early.
const maxExclusions = 1024

// ParseConf decodes and validates stdin data. withOptions parses the
// capture options too (ADD); other commands skip them. The returned
// unknown keys are for the caller to log once it has a logger.
//
// Errors are *types.Error: code 6 for JSON that cannot be decoded, 7 for a
// configuration that is wrong.
func ParseConf(data []byte, withOptions bool) (*Conf, []string, error) {
	c := &Conf{}
	if err := json.Unmarshal(data, &c.PluginConf); err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "decode network config", err.Error())
	}
	var raw rawConf
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, nil, invalidConf("decode nftredir-cni settings: %v", err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "decode network config", err.Error())
	}
	var unknown []string
	for k := range all {
		if !slices.Contains(knownKeys, k) && !strings.HasPrefix(k, "cni.dev/") {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)

	var errs []string
	c.Socket = rpc.DefaultSocket
	if raw.Socket != nil {
		c.Socket = *raw.Socket
		// The plugin runs with whatever working directory the runtime
		// has; a relative path would name a different socket per runtime.
		if !filepath.IsAbs(c.Socket) {
			errs = append(errs, fmt.Sprintf("socket %q must be an absolute path (default %s)", c.Socket, rpc.DefaultSocket))
		}
	}
	c.Timeout = DefaultTimeout
	if raw.Timeout != nil {
		d, err := time.ParseDuration(*raw.Timeout)
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("timeout %q is not a duration (e.g. \"10s\")", *raw.Timeout))
		case d <= 0:
			errs = append(errs, fmt.Sprintf("timeout %q must be positive", *raw.Timeout))
		default:
			c.Timeout = d
		}
	}
	c.DataDir = DefaultDataDir
	if raw.DataDir != nil {
		c.DataDir = *raw.DataDir
		if !filepath.IsAbs(c.DataDir) {
			errs = append(errs, fmt.Sprintf("dataDir %q must be an absolute path (default %s)", c.DataDir, DefaultDataDir))
		}
	}
	for _, ns := range raw.ExcludeNamespaces {
		if ns == "" || strings.ContainsFunc(ns, isSpaceOrControl) {
			errs = append(errs, fmt.Sprintf("excludeNamespaces: %q is not a namespace name", ns))
		}
	}
	c.ExcludeNamespaces = raw.ExcludeNamespaces
	if raw.LogFile != nil {
		c.LogFile = *raw.LogFile
		if !filepath.IsAbs(c.LogFile) {
			errs = append(errs, fmt.Sprintf("logFile %q must be an absolute path", c.LogFile))
		}
	}
	c.LogLevel = hclog.LevelFromString(DefaultLogLevel)
	if raw.LogLevel != nil {
		lvl := hclog.LevelFromString(*raw.LogLevel)
		if lvl == hclog.NoLevel || lvl == hclog.Off {
			errs = append(errs, fmt.Sprintf("logLevel %q is not one of trace, debug, info, warn, error", *raw.LogLevel))
		} else {
			c.LogLevel = lvl
		}
	}

	// Absent or null means no attachment is valid: that is what libcni
	// sends when its caller passes no GC arguments (cnitool gc does), and
	// how the reference plugins read it.
	for _, r := range []struct {
		key string
		msg json.RawMessage
	}{{keyValidAttachments, raw.ValidAttachments}, {keyValidAttachmentsOld, raw.ValidAttachmentsOld}} {
		if r.msg == nil {
			continue
		}
		var list []types.GCAttachment
		if err := json.Unmarshal(r.msg, &list); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r.key, err))
			continue
		}
		for _, a := range list {
			if !slices.Contains(c.ValidAttachments, a) {
				c.ValidAttachments = append(c.ValidAttachments, a)
			}
		}
	}

	kube, kubeErrs := parseKube(raw.Kubernetes)
	c.Kube = kube
	errs = append(errs, kubeErrs...)

	if withOptions {
		opts, optErrs := parseOptions(&raw)
		c.Options = opts
		errs = append(errs, optErrs...)
	}
	if len(errs) > 0 {
		return nil, unknown, invalidConf("invalid nftredir-cni config in network %q: %s", c.Name, strings.Join(errs, "; "))
	}
	return c, unknown, nil
}

// ParsePrevResult decodes the prevResult, converted to the config's
// cniVersion, or returns nil when there is none.
func (c *Conf) ParsePrevResult() (types.Result, error) {
	if c.RawPrevResult == nil {
		return nil, nil
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode prevResult", err.Error())
	}
	return c.PrevResult, nil
}

// Excluded reports whether pods of the Kubernetes namespace ns are left
// alone.
func (c *Conf) Excluded(ns string) bool {
	return ns != "" && slices.Contains(c.ExcludeNamespaces, ns)
}

func parseOptions(raw *rawConf) (*rpc.Options, []string) {
	var errs []string
	o := &rpc.Options{}
	if raw.CaptureMode != nil {
		var s string
		if err := strictDecode(raw.CaptureMode, &s); err != nil {
			errs = append(errs, fmt.Sprintf("captureMode: %v", err))
		} else {
			if m, err := defaults.ParseCaptureMode(s); err != nil {
				errs = append(errs, fmt.Sprintf("captureMode %q is not %s (leave it out for the daemon's default)", s, defaults.CaptureModeNames()))
			} else {
				o.CaptureMode = rpc.CaptureModeOf(m)
			}
		}
	}
	o.ExcludeInboundPorts = parsePorts("excludeInboundPorts", raw.ExcludeInboundPorts, &errs)
	o.ExcludeOutboundPorts = parsePorts("excludeOutboundPorts", raw.ExcludeOutboundPorts, &errs)
	if raw.ExcludeOutboundCIDRs != nil {
		var cidrs []string
		if err := strictDecode(raw.ExcludeOutboundCIDRs, &cidrs); err != nil {
			errs = append(errs, fmt.Sprintf("excludeOutboundCIDRs: %v", err))
		} else if len(cidrs) > maxExclusions {
			errs = append(errs, fmt.Sprintf("excludeOutboundCIDRs has %d entries, at most %d allowed", len(cidrs), maxExclusions))
		} else {
			for _, s := range cidrs {
				if !validCIDR(s) {
					errs = append(errs, fmt.Sprintf("excludeOutboundCIDRs: %q is not a CIDR or an address (e.g. 10.0.0.0/8, fd00::/8, 169.254.169.254)", s))
				}
			}
			o.ExcludeOutboundCIDRs = cidrs
		}
	}
	o.DNSCapture = parseBool("dnsCapture", raw.DNSCapture, &errs)
	o.IPv6 = parseBool("ipv6", raw.IPv6, &errs)
	o.InboundCapture = parseBool("inboundCapture", raw.InboundCapture, &errs)
	o.RerouteVirtualInterfaces = parseInterfaces(raw.RerouteInterfaces, &errs)
	if o.IsZero() {
		// Nothing configured: send no options at all, the plainest way of
		// asking for every daemon default.
		o = nil
	}
	return o, errs
}

func parsePorts(key string, msg json.RawMessage, errs *[]string) []uint32 {
	if msg == nil {
		return nil
	}
	// Decoded loosely first so that 80.5, -1, 1e9 and "80" are each
	// reported as the value they are rather than as a type mismatch.
	var vals []any
	if err := strictDecode(msg, &vals); err != nil {
		*errs = append(*errs, fmt.Sprintf("%s: %v (want a list of port numbers, e.g. [15021, 8080])", key, err))
		return nil
	}
	if len(vals) > maxExclusions {
		*errs = append(*errs, fmt.Sprintf("%s has %d entries, at most %d allowed", key, len(vals), maxExclusions))
		return nil
	}
	ports := make([]uint32, 0, len(vals))
	for _, val := range vals {
		n, ok := val.(json.Number)
		v, err := n.Int64()
		if !ok || err != nil || v < 1 || v > 65535 {
			b, _ := json.Marshal(val)
			*errs = append(*errs, fmt.Sprintf("%s: %s is not a port number (1-65535)", key, b))
			continue
		}
		ports = append(ports, uint32(v))
	}
	return ports
}

// parseInterfaces reads rerouteVirtualInterfaces: a list of interface
// names, as Istio's istio.io/reroute-virtual-interfaces annotation lists
// them. Which names an interface may have, and how many, is the daemon's
// to check (nft.CheckInterfaceName); its refusal fails ADD with code 7 as
// well. Here only what cannot be a name at all is refused, without the
// netlink code that check lives with, which the plugin does not link.
func parseInterfaces(msg json.RawMessage, errs *[]string) []string {
	const key = "rerouteVirtualInterfaces"
	if msg == nil {
		return nil
	}
	var names []string
	if err := strictDecode(msg, &names); err != nil {
		*errs = append(*errs, fmt.Sprintf("%s: %v (want a list of interface names, e.g. [\"k6t-eth0\"])", key, err))
		return nil
	}
	if len(names) > maxExclusions {
		*errs = append(*errs, fmt.Sprintf("%s has %d entries, at most %d allowed", key, len(names), maxExclusions))
		return nil
	}
	for _, n := range names {
		if n == "" || strings.ContainsFunc(n, isSpaceOrControl) {
			*errs = append(*errs, fmt.Sprintf("%s: %q is not an interface name", key, n))
		}
	}
	return names
}

func parseBool(key string, msg json.RawMessage, errs *[]string) *bool {
	if msg == nil {
		return nil
	}
	var b bool
	if err := strictDecode(msg, &b); err != nil {
		*errs = append(*errs, fmt.Sprintf("%s: %v (want true or false)", key, err))
		return nil
	}
	return &b
}

// validCIDR accepts what the daemon accepts: a prefix or a single address.
func validCIDR(s string) bool {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Zone() == ""
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Zone() == ""
}

// strictDecode refuses null and trailing data; encoding/json alone turns
// null into a zero value silently. Numbers stay json.Number.
func strictDecode(msg json.RawMessage, v any) error {
	if bytes.Equal(bytes.TrimSpace(msg), []byte("null")) {
		return errors.New("null is not allowed; leave the key out instead")
	}
	d := json.NewDecoder(bytes.NewReader(msg))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

func isSpaceOrControl(r rune) bool {
	return r <= ' ' || r == 0x7f
}
