// Package enrolment is the Kubernetes enrolment rule: which pods are
// captured, decided from plain labels, annotations and container names.
//
// It is the one copy of the rule. The daemon applies it to the objects of
// its informers (package kube); nftredir-cni applies it to the fields it
// decodes from two GETs when the daemon cannot answer (internal/kubelookup,
// docs/blast-radius.md). It imports nothing beyond the standard library,
// so the plugin, which the runtime execs for every pod, stays small.
package enrolment

import "fmt"

// Istio's vocabulary, the default selector: istiod and ztunnel read the
// same label.
const (
	DefaultModeLabel    = "istio.io/dataplane-mode"
	DefaultModeEnabled  = "ambient"
	DefaultModeDisabled = "none"

	// SidecarStatusAnnotation is set by Istio's injector on pods with a
	// sidecar, which captures their traffic itself.
	SidecarStatusAnnotation = "sidecar.istio.io/status"
	// SidecarContainer is the name of Istio's sidecar container.
	SidecarContainer = "istio-proxy"
)

// Selector is the enrolment policy: which label opts a namespace or a pod
// in, and which value opts a pod out.
type Selector struct {
	Label    string
	Enabled  string
	Disabled string
}

// DefaultSelector is Istio's ambient policy.
func DefaultSelector() Selector {
	return Selector{Label: DefaultModeLabel, Enabled: DefaultModeEnabled, Disabled: DefaultModeDisabled}
}

// Validate reports a selector that cannot work.
func (s Selector) Validate() error {
	switch {
	case s.Label == "":
		return fmt.Errorf("the enrolment label key is empty")
	case s.Enabled == "":
		return fmt.Errorf("the enrolment label's opt-in value is empty")
	case s.Enabled == s.Disabled:
		return fmt.Errorf("the enrolment label's opt-in and opt-out values are both %q", s.Enabled)
	}
	return nil
}

// Pod is what the rule reads of a pod.
type Pod struct {
	Namespace   string
	Labels      map[string]string
	Annotations map[string]string
	HostNetwork bool
	// Deleting: the pod has a deletion timestamp.
	Deleting bool
	// Containers names the pod's containers and init containers.
	Containers []string
}

// Captured says whether pod, in a namespace with labels nsLabels (nil if
// the namespace is unknown or unlabelled), is to be captured, and why not
// when it is not. The order is Istio's: the pod's own opt-out wins, then
// its opt-in, then the namespace's.
func (s Selector) Captured(pod Pod, nsLabels map[string]string) (bool, string) {
	switch {
	case pod.HostNetwork:
		return false, "the pod is on the host network"
	case hasSidecar(pod):
		return false, "the pod has a sidecar proxy"
	case pod.Deleting:
		return false, "the pod is being deleted"
	}
	podMode, podSet := pod.Labels[s.Label]
	switch {
	case podSet && podMode == s.Disabled && s.Disabled != "":
		return false, fmt.Sprintf("the pod is labelled %s=%s", s.Label, podMode)
	case podSet && podMode == s.Enabled:
		return true, ""
	case nsLabels[s.Label] == s.Enabled:
		return true, ""
	}
	return false, fmt.Sprintf("neither the pod nor namespace %s is labelled %s=%s", pod.Namespace, s.Label, s.Enabled)
}

func hasSidecar(pod Pod) bool {
	if _, ok := pod.Annotations[SidecarStatusAnnotation]; ok {
		return true
	}
	for _, c := range pod.Containers {
		if c == SidecarContainer {
			return true
		}
	}
	return false
}
