package enrolment

import "testing"

// The rule's cases as the daemon's tests state them on API objects
// (kube/policy_test.go) run there through kube.EnrolmentPod; these state
// them on the plain shape the plugin decodes.
func TestCaptured(t *testing.T) {
	ambient := map[string]string{DefaultModeLabel: "ambient"}
	none := map[string]string{DefaultModeLabel: "none"}
	app := func(mutate ...func(*Pod)) Pod {
		p := Pod{Namespace: "shop", Containers: []string{"app"}}
		for _, m := range mutate {
			m(&p)
		}
		return p
	}
	labelled := func(l map[string]string) func(*Pod) { return func(p *Pod) { p.Labels = l } }
	tests := []struct {
		name string
		pod  Pod
		ns   map[string]string
		want bool
		why  string
	}{
		{"namespace opts in", app(), ambient, true, ""},
		{"pod opts in", app(labelled(ambient)), nil, true, ""},
		{"neither", app(), nil, false, "neither the pod nor namespace shop is labelled istio.io/dataplane-mode=ambient"},
		{"namespace labelled otherwise", app(), none, false, "neither the pod nor namespace shop is labelled istio.io/dataplane-mode=ambient"},
		{"pod opts out of an opted-in namespace", app(labelled(none)), ambient, false, "the pod is labelled istio.io/dataplane-mode=none"},
		{"other pod value falls back to the namespace", app(labelled(map[string]string{DefaultModeLabel: "sidecar"})), ambient, true, ""},
		{"host network", app(labelled(ambient), func(p *Pod) { p.HostNetwork = true }), ambient, false, "the pod is on the host network"},
		{"sidecar container", app(func(p *Pod) { p.Containers = append(p.Containers, SidecarContainer) }), ambient, false, "the pod has a sidecar proxy"},
		{"sidecar annotation", app(func(p *Pod) { p.Annotations = map[string]string{SidecarStatusAnnotation: "{}"} }), ambient, false, "the pod has a sidecar proxy"},
		{"being deleted", app(labelled(ambient), func(p *Pod) { p.Deleting = true }), nil, false, "the pod is being deleted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := DefaultSelector().Captured(tt.pod, tt.ns)
			if got != tt.want || why != tt.why {
				t.Errorf("Captured = %v, %q; want %v, %q", got, why, tt.want, tt.why)
			}
		})
	}
}

func TestCapturedWithoutOptOutValue(t *testing.T) {
	sel := Selector{Label: "mesh", Enabled: "on"}
	// An empty opt-out value must not turn an unlabelled-but-present
	// empty label into an opt-out.
	if ok, _ := sel.Captured(Pod{Labels: map[string]string{"mesh": ""}}, map[string]string{"mesh": "on"}); !ok {
		t.Error("empty pod label value opted the pod out with no opt-out value configured")
	}
	if err := sel.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if err := (Selector{Label: "mesh", Enabled: "x", Disabled: "x"}).Validate(); err == nil {
		t.Error("Validate accepted equal opt-in and opt-out values")
	}
}
