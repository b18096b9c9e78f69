// Package defaults is the one home of nftredir's default numbers and
// names: the proxy ports, the packet marks, the policy routing, the probe
// source addresses, the capture-mode vocabulary and the pod-UID rule.
// The daemon's flags, the ruleset builder, the routing, the node probe
// table, the client fake, the test helpers and the bench all read them
// from here, so changing one is a one-line change.
//
// The data-path values are those of Istio ambient's in-pod mode, so that
// stock ztunnel (which hard-codes its listener ports and marks) runs on a
// node where nftredird replaces istio-cni's node agent. The package
// imports nothing of the project, so every package may use it.
package defaults

import (
	"net/netip"
	"time"
)

// Proxy ports inside the pod's namespace: ztunnel's in-pod listeners.
const (
	// OutboundPort receives the pod's outgoing TCP (ztunnel's outbound
	// listener).
	OutboundPort uint16 = 15001
	// InboundPort receives incoming plaintext TCP (ztunnel's inbound
	// plaintext listener).
	InboundPort uint16 = 15006
	// HBONEPort receives incoming HBONE, the mTLS tunnel between proxies
	// (ztunnel's inbound listener); it is tproxied, never NATed, because
	// the proxy's own peers connect to it.
	HBONEPort uint16 = 15008
	// DNSPort receives the pod's DNS when DNS capture is on (ztunnel's
	// DNS proxy).
	DNSPort uint16 = 15053
)

// MetricsPort serves the daemon's /healthz, /readyz and /metrics. It is
// istio-cni's monitoring port, the node agent whose place nftredird
// takes, and none of ztunnel's (15000, 15001, 15006, 15008, 15020, 15021,
// 15053), which runs beside it on a hostNetwork node.
const MetricsPort uint16 = 15014

// Socket is where nftredird serves its gRPC API and where callers dial
// it. /run is tmpfs, so the socket never outlives a boot.
const Socket = "/run/nftredir/nftredir.sock"

// StateDir is where nftredird keeps everything it must remember (pod
// records, their leftovers and quarantine, and in Kubernetes mode its
// sightings and annotation marks). /run is tmpfs: the records live
// exactly as long as the network namespaces they describe.
const StateDir = "/run/nftredir/pods"

// LegacyKubeStateDir is where Kubernetes mode kept its sightings and
// marks before they moved under StateDir: a daemon starting in
// Kubernetes mode moves what it finds there into its state directory.
const LegacyKubeStateDir = "/run/nftredir/seen"

// ZDSSocket is where ztunnel dials its node agent for pods' namespaces:
// stock ztunnel's INPOD_UDS default.
const ZDSSocket = "/var/run/ztunnel/ztunnel.sock"

// How callers of the API wait for the daemon: each call is bounded by
// CallTimeout, and one refused with Unavailable (the daemon not listening,
// restarting, or the connection lost) is tried CallAttempts times, from
// CallBackoff doubling up to CallMaxBackoff, which rides out a restart of
// the daemon of about two seconds.
const (
	CallTimeout    = 10 * time.Second
	CallAttempts   = 5
	CallBackoff    = 50 * time.Millisecond
	CallMaxBackoff = time.Second
)

// Marks, as Istio's in-pod rules use them. Both live under MarkMask, the
// low 12 bits, so other users of the packet mark keep the rest.
const (
	// ProxyMark is what the proxy sets (SO_MARK) on its own sockets:
	// their packets are never captured. ztunnel sets 0x539 (1337).
	ProxyMark uint32 = 0x539
	// TProxyMark is set on tproxied packets and restored on their
	// replies; the fwmark rule sends packets carrying it to RouteTable.
	TProxyMark uint32 = 0x111
	// MarkMask is the mask of both marks.
	MarkMask uint32 = 0xfff
)

// Policy routing that delivers packets carrying TProxyMark to local
// sockets: `ip rule add fwmark 0x111/0xfff pref 32764 lookup 100` and
// `ip route add local default dev lo table 100`, as Istio's in-pod
// agent installs them.
const (
	// RouteTable holds the one local default route.
	RouteTable = 100
	// RulePriority places the fwmark rule just before the main table
	// (32766), after anything the pod or its CNI put earlier.
	RulePriority = 32764
)

// ProbeSourceV4 is the address kubelet probes are SNATed to on the node;
// a pod's capture lets it through, so a probe reaches the app and not
// the proxy. It is the link-local address Istio's node agent uses.
func ProbeSourceV4() netip.Addr { return netip.AddrFrom4([4]byte{169, 254, 7, 127}) }

// ProbeSourceV6 is the IPv6 probe source, Istio's
// fd16:9254:7127:1337:ffff:ffff:ffff:ffff (a ULA whose digits echo
// 169.254.7.127 and 1337).
func ProbeSourceV6() netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x16, 0x92, 0x54, 0x71, 0x27, 0x13, 0x37, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
}

// TProxyAddrV4 and TProxyAddrV6 are where TPROXY mode hands inbound TCP:
// loopback, as Istio's in-pod rules tproxy to. Loopback reaches
// listeners bound to loopback and to the wildcard address alike.
func TProxyAddrV4() netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, 1}) }

// TProxyAddrV6 is the IPv6 TPROXY target, ::1.
func TProxyAddrV6() netip.Addr { return netip.IPv6Loopback() }

// Per-pod options a request may leave unset.
const (
	// Mode is the capture mode of a pod that does not choose one.
	Mode = TProxy
	// CaptureDNS is off standalone: redirected to a proxy that does not
	// serve DNS on DNSPort, the pod could resolve no name, so DNS capture
	// is asked for (per pod, or by the daemon's --dns-capture).
	CaptureDNS = false
	// KubernetesCaptureDNS is on in Kubernetes mode, as in Istio (its
	// Helm value dnsCapture: true): ztunnel answers for Services and
	// forwards the rest. --dns-capture=false turns it off node-wide; a
	// pod's annotation overrides either.
	KubernetesCaptureDNS = true
	// IPv6 capture is on: an uncaptured family would be a bypass.
	IPv6 = true
	// InboundCapture is on; off is the "outbound only" mode.
	InboundCapture = true
)

// NetnsDirs are where container runtimes pin pod sandboxes' network
// namespaces: containerd and CRI-O at /var/run/netns/cni-<id>, Docker
// (cri-dockerd, minikube's docker driver) at /var/run/docker/netns.
// Kubernetes mode finds running pods' namespaces among these pins.
func NetnsDirs() []string { return []string{"/var/run/netns", "/var/run/docker/netns"} }

// How the container runtime hands nftredird the pods it starts
// (--enrolment, the chart's enrolment.via). EnrolmentCNI chains
// nftredir-cni after the network's plugins: an exec per pod, fail-closed
// on every runtime. EnrolmentNRI registers nftredird as a plugin of the
// runtime's Node Resource Interface: no exec, fail-closed only where the
// runtime's validator requires the plugin. EnrolmentAuto takes NRI where
// the runtime is one of those, the CNI chain elsewhere.
const (
	EnrolmentCNI  = "cni"
	EnrolmentNRI  = "nri"
	EnrolmentAuto = "auto"
	// Enrolment is the CNI chain: it needs nothing of the runtime's
	// configuration, which NRI's fail-closed gate does.
	Enrolment = EnrolmentCNI
)

// Enrolments lists the values of --enrolment, in the order help texts
// name them.
func Enrolments() []string { return []string{EnrolmentCNI, EnrolmentNRI, EnrolmentAuto} }

// NRISocket is where containerd and CRI-O accept NRI plugins by default.
const NRISocket = "/var/run/nri/nri.sock"

// NRIPluginName is the name nftredird registers under with the runtime's
// NRI, and the one an operator lists in the runtime's required plugins.
// NRIPluginIndex orders it among other plugins: early, so a plugin that
// adjusts containers later sees the pod captured; after 00, the
// runtime's own validator.
const (
	NRIPluginName  = "nftredir"
	NRIPluginIndex = "10"
)

// NRITolerateAnnotation is the annotation the runtime's validator is
// configured to accept (tolerate_missing_plugins_annotation) on pods that
// must start while nftredird is away: its own pod, and the node's static
// pods. It is the NRI project's documented example key.
const NRITolerateAnnotation = "tolerate-missing-nri-plugins.noderesource.dev"

// NRIGateFile is where nftredird notes, for the CNI install step, that
// it is registered with a runtime whose NRI validator holds pods back
// while it is away: the plugin need not be chained any more. On the
// host's /run, which both containers of the DaemonSet mount.
const NRIGateFile = "/run/nftredir/nri-gate"
