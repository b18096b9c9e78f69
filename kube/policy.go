// Package kube makes nftredird a Kubernetes node agent: it watches the
// pods of its node and their namespaces, decides which pods are captured
// (Istio's ambient labels by default), fills in what the API knows of a
// pod (name, namespace, UID, service account, options from annotations),
// enrols and releases running pods as their labels change, and shows the
// outcome on the pod (an annotation, Events).
//
// Only the daemon's wiring imports it; the server knows it only as a
// lifecycle.Policy.
package kube

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/enrolment"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Istio's vocabulary, the default selector: istiod and ztunnel read the
// same label and annotation.
const (
	DefaultModeLabel    = enrolment.DefaultModeLabel
	DefaultModeEnabled  = enrolment.DefaultModeEnabled
	DefaultModeDisabled = enrolment.DefaultModeDisabled

	// RedirectionAnnotation marks a pod whose traffic is captured; istiod
	// treats a workload as ambient by it. It states what is, not intent.
	RedirectionAnnotation = "ambient.istio.io/redirection"
)

// Selector is the enrolment policy: which label opts a namespace or a pod
// in, and which value opts a pod out. The rule itself is
// internal/enrolment's, which nftredir-cni applies too when the daemon
// cannot answer.
type Selector enrolment.Selector

// DefaultSelector is Istio's ambient policy.
func DefaultSelector() Selector { return Selector(enrolment.DefaultSelector()) }

// Validate reports a selector that cannot work.
func (s Selector) Validate() error { return enrolment.Selector(s).Validate() }

// Captured says whether pod, in namespace ns (nil if unknown), is to be
// captured, and why not when it is not (enrolment.Selector.Captured).
func (s Selector) Captured(pod *corev1.Pod, ns *corev1.Namespace) (bool, string) {
	var nsLabels map[string]string
	if ns != nil {
		nsLabels = ns.Labels
	}
	return enrolment.Selector(s).Captured(EnrolmentPod(pod), nsLabels)
}

// EnrolmentPod is what the enrolment rule reads of pod.
func EnrolmentPod(pod *corev1.Pod) enrolment.Pod {
	p := enrolment.Pod{
		Namespace:   pod.Namespace,
		Labels:      pod.Labels,
		Annotations: pod.Annotations,
		HostNetwork: pod.Spec.HostNetwork,
		Deleting:    pod.DeletionTimestamp != nil,
	}
	for _, c := range pod.Spec.InitContainers {
		p.Containers = append(p.Containers, c.Name)
	}
	for _, c := range pod.Spec.Containers {
		p.Containers = append(p.Containers, c.Name)
	}
	return p
}

// Per-pod capture options, as annotations of nftredir's own. Each
// overrides the same field of the CNI configuration's options; the daemon
// then validates the result exactly as an AddPod request's options.
const (
	annotationPrefix = "nftredir.io/"

	AnnotationCaptureMode          = annotationPrefix + "capture-mode"           // tproxy or redirect
	AnnotationExcludeInboundPorts  = annotationPrefix + "exclude-inbound-ports"  // "8080,9090"
	AnnotationExcludeOutboundPorts = annotationPrefix + "exclude-outbound-ports" // "5432"
	AnnotationExcludeOutboundCIDRs = annotationPrefix + "exclude-outbound-cidrs" // "10.0.0.0/8,169.254.169.254"
	AnnotationDNSCapture           = annotationPrefix + "dns-capture"            // true or false
	AnnotationInboundCapture       = annotationPrefix + "inbound-capture"        // true or false
)

// Istio's per-pod capture annotations, read with Istio's semantics
// (istio-cni's cni/pkg/nodeagent/net.go): a boolean that does not parse is
// ignored, as Istio ignores it, and the pod gets a Warning Event saying so.
// Where one sets the same option as an nftredir.io annotation, the
// nftredir.io annotation wins: it is the more specific of the two, and a
// migration from istio-cni keeps working as it did until one is added.
const (
	// AnnotationIstioDNSCapture is nftredir.io/dns-capture's twin.
	AnnotationIstioDNSCapture = "ambient.istio.io/dns-capture" // true or false
	// AnnotationIstioBypassInbound "true" leaves inbound uncaptured (the
	// outbound still is): nftredir.io/inbound-capture "false".
	AnnotationIstioBypassInbound = "ambient.istio.io/bypass-inbound-capture" // true or false
	// AnnotationIstioRerouteInterfaces lists interfaces whose incoming
	// TCP is treated as the pod's outbound (options
	// reroute_virtual_interfaces). No nftredir.io twin.
	AnnotationIstioRerouteInterfaces = "istio.io/reroute-virtual-interfaces" // "k6t-eth0,tap0"
)

// istioAnnotations are the Istio annotations that change capture.
var istioAnnotations = []string{AnnotationIstioDNSCapture, AnnotationIstioBypassInbound, AnnotationIstioRerouteInterfaces}

// istioOptions applies Istio's annotations to o and returns the ones it
// ignored, each with why.
func istioOptions(annotations map[string]string, o *nftredirv1.RedirectOptions) []string {
	var ignored []string
	boolean := func(key string) (bool, bool) {
		v, ok := annotations[key]
		if !ok {
			return false, false
		}
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			ignored = append(ignored, fmt.Sprintf("annotation %s: %q is not true or false; ignored, as Istio does", key, v))
			return false, false
		}
		return b, true
	}
	if b, ok := boolean(AnnotationIstioDNSCapture); ok {
		o.DnsCapture = &b
	}
	if b, ok := boolean(AnnotationIstioBypassInbound); ok {
		capture := !b
		o.InboundCapture = &capture
	}
	if v, ok := annotations[AnnotationIstioRerouteInterfaces]; ok {
		// Names are checked by the daemon with the other options: an
		// interface the kernel cannot have refuses the pod.
		o.RerouteVirtualInterfaces = splitList(v)
	}
	return ignored
}

// IgnoredAnnotations lists the pod's Istio annotations Options ignores
// (values that do not parse), each saying why; the agent shows them on
// the pod as a Warning Event.
func IgnoredAnnotations(annotations map[string]string) []string {
	return istioOptions(annotations, &nftredirv1.RedirectOptions{})
}

// knownAnnotations lists every option annotation, so a misspelt one is an
// error rather than silently ignored.
var knownAnnotations = map[string]bool{
	AnnotationCaptureMode: true, AnnotationExcludeInboundPorts: true, AnnotationExcludeOutboundPorts: true,
	AnnotationExcludeOutboundCIDRs: true, AnnotationDNSCapture: true, AnnotationInboundCapture: true,
}

// Options applies the pod's option annotations over base (which is not
// modified): Istio's, then nftredir.io's, so that nftredir.io's win. The
// values are parsed here; their meaning (port ranges, CIDR forms, limits,
// interface names) is checked by the daemon like any request's. A bad
// nftredir.io annotation is an error; a bad Istio boolean is ignored
// (IgnoredAnnotations).
func Options(annotations map[string]string, base *nftredirv1.RedirectOptions) (*nftredirv1.RedirectOptions, error) {
	o := &nftredirv1.RedirectOptions{}
	if base != nil {
		o = proto.Clone(base).(*nftredirv1.RedirectOptions)
	}
	istioOptions(annotations, o)
	var problems []string
	bad := func(key, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("annotation %s: %s", key, fmt.Sprintf(format, args...)))
	}
	for key, v := range annotations {
		if !strings.HasPrefix(key, annotationPrefix) {
			continue
		}
		if !knownAnnotations[key] {
			bad(key, "unknown; the options are %s", strings.Join(slices.Sorted(maps.Keys(knownAnnotations)), ", "))
			continue
		}
		v = strings.TrimSpace(v)
		switch key {
		case AnnotationCaptureMode:
			m, err := apimode.Parse(v)
			if err != nil {
				bad(key, "%q is not a capture mode; use %s", v, strings.ToLower(defaults.CaptureModeNames()))
				continue
			}
			o.CaptureMode = m
		case AnnotationExcludeInboundPorts, AnnotationExcludeOutboundPorts:
			ports, err := parsePorts(v)
			if err != nil {
				bad(key, "%v", err)
				continue
			}
			if key == AnnotationExcludeInboundPorts {
				o.ExcludeInboundPorts = ports
			} else {
				o.ExcludeOutboundPorts = ports
			}
		case AnnotationExcludeOutboundCIDRs:
			var cidrs []string
			for _, f := range splitList(v) {
				if _, err := netip.ParsePrefix(f); err != nil {
					if _, err := netip.ParseAddr(f); err != nil {
						bad(key, "%q is not a CIDR or address (e.g. 10.0.0.0/8 or 169.254.169.254)", f)
						continue
					}
				}
				cidrs = append(cidrs, f)
			}
			o.ExcludeOutboundCidrs = cidrs
		case AnnotationDNSCapture, AnnotationInboundCapture:
			b, err := strconv.ParseBool(v)
			if err != nil {
				bad(key, "%q is not true or false", v)
				continue
			}
			if key == AnnotationDNSCapture {
				o.DnsCapture = &b
			} else {
				o.InboundCapture = &b
			}
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems) // map order is random; the message must not be
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return o, nil
}

func parsePorts(v string) ([]uint32, error) {
	var out []uint32
	for _, f := range splitList(v) {
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a port number", f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// splitList reads a comma-separated annotation value; spaces around the
// items are allowed, empty items are not kept.
func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
