package kube

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// TestIstioOptions: Istio's per-pod annotations with Istio's semantics,
// over the CNI configuration's options; nftredir.io's win where both set
// one option.
func TestIstioOptions(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name        string
		annotations map[string]string
		base        *nftredirv1.RedirectOptions
		want        *nftredirv1.RedirectOptions
		ignored     []string
	}{
		{"dns capture off", map[string]string{AnnotationIstioDNSCapture: "false"}, nil,
			&nftredirv1.RedirectOptions{DnsCapture: &no}, nil},
		{"dns capture on over a base that is off", map[string]string{AnnotationIstioDNSCapture: "true"}, &nftredirv1.RedirectOptions{DnsCapture: &no},
			&nftredirv1.RedirectOptions{DnsCapture: &yes}, nil},
		{"bypass inbound", map[string]string{AnnotationIstioBypassInbound: "true"}, nil,
			&nftredirv1.RedirectOptions{InboundCapture: &no}, nil},
		{"bypass inbound false captures inbound", map[string]string{AnnotationIstioBypassInbound: "false"}, &nftredirv1.RedirectOptions{InboundCapture: &no},
			&nftredirv1.RedirectOptions{InboundCapture: &yes}, nil},
		{"reroute interfaces", map[string]string{AnnotationIstioRerouteInterfaces: " k6t-eth0, tap0 ,"}, nil,
			&nftredirv1.RedirectOptions{RerouteVirtualInterfaces: []string{"k6t-eth0", "tap0"}}, nil},
		{"nftredir.io wins", map[string]string{
			AnnotationIstioDNSCapture: "true", AnnotationDNSCapture: "false",
			AnnotationIstioBypassInbound: "true", AnnotationInboundCapture: "true",
		}, nil, &nftredirv1.RedirectOptions{DnsCapture: &no, InboundCapture: &yes}, nil},
		{"a bad Istio boolean is ignored, the base stays", map[string]string{AnnotationIstioDNSCapture: "yes please", AnnotationIstioBypassInbound: "1"}, &nftredirv1.RedirectOptions{DnsCapture: &yes},
			&nftredirv1.RedirectOptions{DnsCapture: &yes, InboundCapture: &no},
			[]string{`annotation ambient.istio.io/dns-capture: "yes please" is not true or false; ignored, as Istio does`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Options(tt.annotations, tt.base)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, protocmp.Transform()); d != "" {
				t.Errorf("options (-want +got):\n%s", d)
			}
			if ig := IgnoredAnnotations(tt.annotations); !slices.Equal(ig, tt.ignored) {
				t.Errorf("ignored %q; want %q", ig, tt.ignored)
			}
		})
	}
}

// TestIstioAnnotationsAreOptionAnnotations: a change of an Istio
// annotation re-enrols a captured pod, as a change of nftredir.io's does;
// other annotations do not.
func TestIstioAnnotationsAreOptionAnnotations(t *testing.T) {
	base := optionAnnotations(map[string]string{"other": "x"})
	for _, k := range []string{AnnotationIstioDNSCapture, AnnotationIstioBypassInbound, AnnotationIstioRerouteInterfaces, AnnotationDNSCapture} {
		if optionAnnotations(map[string]string{"other": "x", k: "true"}) == base {
			t.Errorf("%s is not part of the options fingerprint", k)
		}
	}
	if optionAnnotations(map[string]string{"other": "y", RedirectionAnnotation: "enabled"}) != base {
		t.Error("non-option annotations change the fingerprint")
	}
	if !strings.Contains(optionAnnotations(map[string]string{AnnotationIstioRerouteInterfaces: "tap0"}), "tap0") {
		t.Error("fingerprint lacks the value")
	}
}
