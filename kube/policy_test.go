package kube

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

func pod(labels, annotations map[string]string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func namespace(labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: labels}}
}

func TestCaptured(t *testing.T) {
	ambient := map[string]string{DefaultModeLabel: "ambient"}
	none := map[string]string{DefaultModeLabel: "none"}
	now := metav1.Now()
	tests := []struct {
		name string
		pod  *corev1.Pod
		ns   *corev1.Namespace
		want bool
		why  string
	}{
		{"namespace opts in", pod(nil, nil), namespace(ambient), true, ""},
		{"pod opts in", pod(ambient, nil), namespace(nil), true, ""},
		{"pod opts in, namespace unknown", pod(ambient, nil), nil, true, ""},
		{"neither", pod(nil, nil), namespace(nil), false, "neither the pod nor namespace shop is labelled istio.io/dataplane-mode=ambient"},
		{"pod opts out of an opted-in namespace", pod(none, nil), namespace(ambient), false, "the pod is labelled istio.io/dataplane-mode=none"},
		{"other label value on the pod falls back to the namespace", pod(map[string]string{DefaultModeLabel: "sidecar"}, nil), namespace(ambient), true, ""},
		{"host network", pod(ambient, nil, func(p *corev1.Pod) { p.Spec.HostNetwork = true }), namespace(ambient), false, "the pod is on the host network"},
		{"sidecar container", pod(nil, nil, func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy"})
		}), namespace(ambient), false, "the pod has a sidecar proxy"},
		{"native sidecar", pod(nil, nil, func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "istio-proxy"}}
		}), namespace(ambient), false, "the pod has a sidecar proxy"},
		{"sidecar status annotation", pod(nil, map[string]string{"sidecar.istio.io/status": "{}"}), namespace(ambient), false, "the pod has a sidecar proxy"},
		{"being deleted", pod(ambient, nil, func(p *corev1.Pod) { p.DeletionTimestamp = &now }), namespace(nil), false, "the pod is being deleted"},
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

func TestCapturedCustomSelector(t *testing.T) {
	sel := Selector{Label: "mesh.example/capture", Enabled: "yes", Disabled: "no"}
	if ok, _ := sel.Captured(pod(nil, nil), namespace(map[string]string{DefaultModeLabel: "ambient"})); ok {
		t.Error("Istio's label selected a pod under a custom selector")
	}
	if ok, _ := sel.Captured(pod(nil, nil), namespace(map[string]string{"mesh.example/capture": "yes"})); !ok {
		t.Error("custom label on the namespace did not select the pod")
	}
	if ok, _ := sel.Captured(pod(map[string]string{"mesh.example/capture": "no"}, nil), namespace(map[string]string{"mesh.example/capture": "yes"})); ok {
		t.Error("custom opt-out not honoured")
	}
}

func TestSelectorValidate(t *testing.T) {
	for _, s := range []Selector{{}, {Label: "a"}, {Label: "a", Enabled: "x", Disabled: "x"}} {
		if s.Validate() == nil {
			t.Errorf("%+v validated", s)
		}
	}
	if err := DefaultSelector().Validate(); err != nil {
		t.Error(err)
	}
}

func TestOptions(t *testing.T) {
	yes, no := true, false
	base := &nftredirv1.RedirectOptions{ExcludeInboundPorts: []uint32{22}, DnsCapture: &yes}
	got, err := Options(map[string]string{
		AnnotationCaptureMode:          "REDIRECT",
		AnnotationExcludeOutboundPorts: " 5432, 6379 ,",
		AnnotationExcludeOutboundCIDRs: "10.0.0.0/8,169.254.169.254",
		AnnotationDNSCapture:           "false",
		AnnotationInboundCapture:       "false",
		"other.io/unrelated":           "x",
	}, base)
	if err != nil {
		t.Fatal(err)
	}
	want := &nftredirv1.RedirectOptions{
		CaptureMode:          nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
		ExcludeInboundPorts:  []uint32{22},
		ExcludeOutboundPorts: []uint32{5432, 6379},
		ExcludeOutboundCidrs: []string{"10.0.0.0/8", "169.254.169.254"},
		DnsCapture:           &no,
		InboundCapture:       &no,
	}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("options (-want +got):\n%s", d)
	}
	if !base.GetDnsCapture() || len(base.GetExcludeOutboundPorts()) != 0 {
		t.Error("Options modified its base")
	}
}

func TestOptionsErrors(t *testing.T) {
	_, err := Options(map[string]string{
		AnnotationCaptureMode:          "nat",
		AnnotationExcludeInboundPorts:  "80,http",
		AnnotationDNSCapture:           "maybe",
		"nftredir.io/exclude-ports":    "80",
		AnnotationExcludeOutboundCIDRs: "10.0.0.0/33",
	}, nil)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`annotation nftredir.io/capture-mode: "nat" is not a capture mode`,
		`annotation nftredir.io/exclude-inbound-ports: "http" is not a port number`,
		`annotation nftredir.io/dns-capture: "maybe" is not true or false`,
		`annotation nftredir.io/exclude-ports: unknown`,
		`annotation nftredir.io/exclude-outbound-cidrs: "10.0.0.0/33" is not a CIDR`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// The same annotations give the same message, whatever the map order.
	_, err2 := Options(map[string]string{
		AnnotationDNSCapture: "maybe", AnnotationCaptureMode: "nat", AnnotationExcludeInboundPorts: "80,http",
		"nftredir.io/exclude-ports": "80", AnnotationExcludeOutboundCIDRs: "10.0.0.0/33",
	}, nil)
	if err2.Error() != err.Error() {
		t.Errorf("messages differ:\n%s\n%s", err, err2)
	}
}
