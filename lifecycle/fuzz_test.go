package lifecycle

import (
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// FuzzValidateAdd feeds AddPodRequests, decoded from arbitrary bytes as
// the gRPC server would, to the request validation. A request is either
// refused with InvalidArgument or yields a pod whose spec builds and
// whose fields are in normal form; the same request always gives the same
// answer.
func FuzzValidateAdd(f *testing.F) {
	for _, req := range []*nftredirv1.AddPodRequest{
		{PodUid: "7d0f0c1e-1", NetnsPath: "/run/netns/p"},
		{
			PodUid: "pod-a", PodName: "web-0", PodNamespace: "shop", NetnsPath: "/proc/42/ns/net",
			PodIps: []string{"10.244.1.7", "fd00:10:244:1::7"}, ServiceAccount: proto.String("web"),
			Options: &nftredirv1.RedirectOptions{
				CaptureMode:          nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
				ExcludeInboundPorts:  []uint32{8080, 15021},
				ExcludeOutboundPorts: []uint32{53},
				ExcludeOutboundCidrs: []string{"169.254.169.254/32", "fd00::/8"},
				DnsCapture:           proto.Bool(true),
				Ipv6:                 proto.Bool(true),
				InboundCapture:       proto.Bool(false),
			},
		},
		{PodUid: "p", NetnsPath: "/run/netns/p", Options: &nftredirv1.RedirectOptions{Ipv6: proto.Bool(false), ExcludeOutboundCidrs: []string{"fd00::/8"}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	spec := nft.DefaultSpec("")
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &nftredirv1.AddPodRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		a, err := validateAdd(req, spec)
		again, err2 := validateAdd(req, spec)
		if (err == nil) != (err2 == nil) || (err == nil && !reflect.DeepEqual(a, again)) {
			t.Fatalf("validateAdd is not deterministic: %v / %v", err, err2)
		}
		if err != nil {
			if Classify(err).Kind != KindInvalid {
				t.Fatalf("refusal of kind %v: %v", Classify(err).Kind, err)
			}
			return
		}
		if err := defaults.CheckPodUID(a.uid); err != nil {
			t.Fatalf("accepted pod_uid %q fails its own check: %v", a.uid, err)
		}
		if !filepath.IsAbs(a.netnsPath) || filepath.Clean(a.netnsPath) != a.netnsPath {
			t.Fatalf("accepted netns_path %q", a.netnsPath)
		}
		if a.spec.PodID != a.uid {
			t.Fatalf("spec pod id %q, uid %q", a.spec.PodID, a.uid)
		}
		if _, err := nft.Build(a.spec); err != nil {
			t.Fatalf("accepted request builds no ruleset: %v\nspec %+v", err, a.spec)
		}
		// Normal form: feeding the result back changes nothing.
		if !slices.IsSorted(a.podIPs) {
			t.Fatalf("pod IPs not sorted: %v", a.podIPs)
		}
		req2 := proto.Clone(req).(*nftredirv1.AddPodRequest)
		req2.PodIps = a.podIPs
		b, err := validateAdd(req2, spec)
		if err != nil || !slices.Equal(b.podIPs, a.podIPs) {
			t.Fatalf("normalised pod IPs %v: %v, %v", a.podIPs, err, b)
		}
	})
}
