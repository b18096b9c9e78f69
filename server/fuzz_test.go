package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/netns"
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
	defaults := nft.DefaultSpec("")
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &nftredirv1.AddPodRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		a, err := validateAdd(req, defaults)
		again, err2 := validateAdd(req, defaults)
		if (err == nil) != (err2 == nil) || (err == nil && !reflect.DeepEqual(a, again)) {
			t.Fatalf("validateAdd is not deterministic: %v / %v", err, err2)
		}
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("refusal with code %v: %v", status.Code(err), err)
			}
			return
		}
		if err := checkPodUID(a.uid); err != nil {
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
		b, err := validateAdd(req2, defaults)
		if err != nil || !slices.Equal(b.podIPs, a.podIPs) {
			t.Fatalf("normalised pod IPs %v: %v, %v", a.podIPs, err, b)
		}
	})
}

// FuzzRecordDecode writes arbitrary bytes as a pod's record file and
// reads it back as the daemon does at start. A record is refused (and
// would be quarantined) or is one the daemon can act on: its ruleset
// builds, its namespace id and routing parse, and writing it out again
// reads back as the same intent.
func FuzzRecordDecode(f *testing.F) {
	spec := nft.DefaultSpec("pod-a")
	spec.ExcludeInboundPorts = []uint16{8080}
	rec := &Record{
		Version: recordVersion, PodUID: "pod-a", PodName: "web-0", PodNamespace: "shop",
		NetnsPath: "/run/netns/p", NetnsID: "4:4026532000:8193", PodIPs: []string{"10.0.0.7"},
		Spec: specRecord(spec), Routing: routingRecord(netns.DefaultRouting()),
		EnrolledAt: time.Unix(1700000000, 0).UTC(), UpdatedAt: time.Unix(1700000001, 0).UTC(),
	}
	b, err := json.Marshal(rec)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	rec.Leaving = &Leaving{NetnsPath: "/run/netns/old", NetnsID: "4:4026531999", Routing: rec.Routing}
	if b, err = json.Marshal(rec); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	st, err := OpenStore(f.TempDir(), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Stored under the name of the uid it claims, so that the
		// fuzzer can reach records the daemon accepts.
		var head struct {
			PodUID string `json:"podUid"`
		}
		json.Unmarshal(data, &head)
		name := fileName(head.PodUID)
		path := filepath.Join(st.dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		r, err := st.read(name)
		if err != nil {
			return
		}
		if _, err := r.ruleset(); err != nil {
			t.Fatalf("accepted record builds no ruleset: %v", err)
		}
		if id, err := r.netnsID(); err != nil || id.IsZero() {
			t.Fatalf("accepted record's namespace id %q: %v", r.NetnsID, err)
		}
		if err := r.Routing.netns().Validate(); err != nil {
			t.Fatalf("accepted record's routing: %v", err)
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		r2, err := st.read(name)
		if err != nil {
			t.Fatalf("a record written back from an accepted one is refused: %v\n%s", err, out)
		}
		if !sameIntent(r, r2) {
			t.Fatalf("round trip changed the record:\n%s\n%+v", out, r2)
		}
	})
}
