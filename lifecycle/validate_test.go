package lifecycle

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/state"
)

func validAdd() *nftredirv1.AddPodRequest {
	return &nftredirv1.AddPodRequest{
		PodUid:    "0b5c8f3e-4c1d-4f7a-9d2e-6a1b2c3d4e5f",
		PodName:   "web-0",
		NetnsPath: "/var/run/netns/cni-1234",
		PodIps:    []string{"10.244.1.7", "fd00:10:244:1::7"},
		Options: &nftredirv1.RedirectOptions{
			ExcludeInboundPorts:  []uint32{15021},
			ExcludeOutboundCidrs: []string{"169.254.169.254", "10.0.0.0/8"},
		},
	}
}

func TestValidateAddRejects(t *testing.T) {
	many := func(n int) []uint32 {
		ps := make([]uint32, n)
		for i := range ps {
			ps[i] = uint32(1000 + i)
		}
		return ps
	}
	tests := []struct {
		name   string
		edit   func(r *nftredirv1.AddPodRequest)
		expect string // a fragment of the message that tells what to fix
	}{
		{"empty uid", func(r *nftredirv1.AddPodRequest) { r.PodUid = "" }, "pod_uid is required"},
		{"long uid", func(r *nftredirv1.AddPodRequest) { r.PodUid = strings.Repeat("a", 129) }, "at most 128"},
		{"uid with slash", func(r *nftredirv1.AddPodRequest) { r.PodUid = "../etc/passwd" }, "slashes"},
		{"uid with quote", func(r *nftredirv1.AddPodRequest) { r.PodUid = `a"b` }, "quotes"},
		{"uid with backslash", func(r *nftredirv1.AddPodRequest) { r.PodUid = `a\b` }, "backslashes"},
		{"uid with newline", func(r *nftredirv1.AddPodRequest) { r.PodUid = "a\nb" }, "pod_uid"},
		{"uid with space", func(r *nftredirv1.AddPodRequest) { r.PodUid = "a b" }, "spaces"},
		{"uid not utf8", func(r *nftredirv1.AddPodRequest) { r.PodUid = "a\xffb" }, "UTF-8"},
		{"name with control", func(r *nftredirv1.AddPodRequest) { r.PodName = "x\x1b[2J" }, "pod_name"},
		{"long namespace", func(r *nftredirv1.AddPodRequest) { r.PodNamespace = strings.Repeat("n", 300) }, "pod_namespace"},
		{"service account control", func(r *nftredirv1.AddPodRequest) { r.ServiceAccount = proto.String("sa\x00") }, "service_account"},
		{"empty path", func(r *nftredirv1.AddPodRequest) { r.NetnsPath = "" }, "netns_path is required"},
		{"relative path", func(r *nftredirv1.AddPodRequest) { r.NetnsPath = "run/netns/x" }, "relative"},
		{"unclean path", func(r *nftredirv1.AddPodRequest) { r.NetnsPath = "/run/netns/../netns/x" }, `use "/run/netns/x"`},
		{"trailing slash", func(r *nftredirv1.AddPodRequest) { r.NetnsPath = "/run/netns/x/" }, "clean form"},
		{"long path", func(r *nftredirv1.AddPodRequest) { r.NetnsPath = "/" + strings.Repeat("a", 4096) }, "at most 4096"},
		{"path with NUL", func(r *nftredirv1.AddPodRequest) { r.NetnsPath = "/run/netns/x\x00y" }, "control character"},
		{"bad ip", func(r *nftredirv1.AddPodRequest) { r.PodIps = []string{"10.0.0.300"} }, `pod_ips: "10.0.0.300"`},
		{"ip with prefix", func(r *nftredirv1.AddPodRequest) { r.PodIps = []string{"10.0.0.1/24"} }, "without prefix length"},
		{"ip with zone", func(r *nftredirv1.AddPodRequest) { r.PodIps = []string{"fe80::1%eth0"} }, "zone"},
		{"mapped ip", func(r *nftredirv1.AddPodRequest) { r.PodIps = []string{"::ffff:10.0.0.1"} }, "IPv4 form"},
		{"too many ips", func(r *nftredirv1.AddPodRequest) { r.PodIps = slices.Repeat([]string{"10.0.0.1"}, 17) }, "at most 16"},
		{"port zero", func(r *nftredirv1.AddPodRequest) { r.Options.ExcludeInboundPorts = []uint32{0} }, "exclude_inbound_ports: 0 is not a port"},
		{"port too big", func(r *nftredirv1.AddPodRequest) { r.Options.ExcludeOutboundPorts = []uint32{65536} }, "exclude_outbound_ports: 65536"},
		{"too many ports", func(r *nftredirv1.AddPodRequest) { r.Options.ExcludeInboundPorts = many(nft.MaxExcludedPorts + 1) }, "at most 64"},
		{"bad cidr", func(r *nftredirv1.AddPodRequest) { r.Options.ExcludeOutboundCidrs = []string{"10.0.0.0/33"} }, "is not a CIDR"},
		{"cidr host bits", func(r *nftredirv1.AddPodRequest) { r.Options.ExcludeOutboundCidrs = []string{"10.1.2.3/8"} }, "did you mean 10.0.0.0/8"},
		{"v6 cidr with ipv6 off", func(r *nftredirv1.AddPodRequest) {
			r.Options.Ipv6 = proto.Bool(false)
			r.Options.ExcludeOutboundCidrs = []string{"fd00::/8"}
		}, "IPv6 capture is off"},
		{"unknown mode", func(r *nftredirv1.AddPodRequest) { r.Options.CaptureMode = 7 }, "capture_mode 7 is unknown"},
		{"tproxy v4 not an address", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv4 = proto.String("localhost") }, `tproxy_ipv4: "localhost" is not an IP address`},
		{"tproxy v4 given v6", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv4 = proto.String("::1") }, "tproxy_ipv4: \"::1\" is not an IPv4 address"},
		{"tproxy v6 given v4", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv6 = proto.String("127.0.0.1") }, "tproxy_ipv6: \"127.0.0.1\" is not an IPv6 address"},
		{"tproxy v6 mapped", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv6 = proto.String("::ffff:127.0.0.1") }, "is not an IPv6 address"},
		{"tproxy unspecified", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv4 = proto.String("0.0.0.0") }, "not a unicast address"},
		{"tproxy multicast", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv6 = proto.String("ff02::1") }, "not a unicast address"},
		{"tproxy zone", func(r *nftredirv1.AddPodRequest) { r.Options.TproxyIpv6 = proto.String("fe80::1%eth0") }, "has a zone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := validAdd()
			tt.edit(req)
			_, err := validateAdd(req, nft.DefaultSpec(""))
			if Classify(err).Kind != KindInvalid {
				t.Fatalf("kind = %v (%v), want KindInvalid", Classify(err).Kind, err)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.expect) {
				t.Fatalf("message %q does not say %q", msg, tt.expect)
			}
		})
	}
}

func TestValidateAddListsEveryProblemOnce(t *testing.T) {
	req := &nftredirv1.AddPodRequest{Options: &nftredirv1.RedirectOptions{ExcludeInboundPorts: make([]uint32, 1000)}}
	_, err := validateAdd(req, nft.DefaultSpec(""))
	msg := err.Error()
	for _, want := range []string{"pod_uid is required", "netns_path is required", "more problems"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if len(msg) > 2000 {
		t.Errorf("message is %d bytes; a flood of bad ports must not flood the reply", len(msg))
	}
}

func TestValidateAddNormalises(t *testing.T) {
	req := validAdd()
	req.PodIps = []string{"fd00:10:244:1:0::7", "10.244.1.7", "10.244.1.7"}
	req.Options = &nftredirv1.RedirectOptions{
		CaptureMode:          nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
		ExcludeInboundPorts:  []uint32{8080, 15021, 8080},
		ExcludeOutboundCidrs: []string{"fd00::/8", "169.254.169.254", "10.0.0.0/8"},
		DnsCapture:           proto.Bool(true),
		InboundCapture:       proto.Bool(false),
	}
	a, err := validateAdd(req, nft.DefaultSpec(""))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.244.1.7", "fd00:10:244:1::7"}; !slices.Equal(a.podIPs, want) {
		t.Errorf("pod IPs = %v, want %v", a.podIPs, want)
	}
	s := a.spec
	if s.PodID != req.PodUid || s.Mode != nft.ModeRedirect || !s.CaptureDNS || !s.NoInboundCapture || !s.IPv6 {
		t.Errorf("options not applied: %+v", s)
	}
	if want := []uint16{8080, 15021}; !slices.Equal(s.ExcludeInboundPorts, want) {
		t.Errorf("ports = %v, want %v", s.ExcludeInboundPorts, want)
	}
	var cidrs []string
	for _, c := range s.ExcludeOutboundCIDRs {
		cidrs = append(cidrs, c.String())
	}
	if want := []string{"10.0.0.0/8", "169.254.169.254/32", "fd00::/8"}; !slices.Equal(cidrs, want) {
		t.Errorf("CIDRs = %v, want %v", cidrs, want)
	}
	if _, err := nft.Build(s); err != nil {
		t.Errorf("a validated request must build: %v", err)
	}
}

func TestValidateAddTakesDefaults(t *testing.T) {
	d := nft.DefaultSpec("")
	d.Mode = nft.ModeRedirect
	d.CaptureDNS = true
	d.OutboundPort = 16001
	a, err := validateAdd(&nftredirv1.AddPodRequest{PodUid: "p", NetnsPath: "/run/netns/p"}, d)
	if err != nil {
		t.Fatal(err)
	}
	if a.spec.Mode != nft.ModeRedirect || !a.spec.CaptureDNS || a.spec.OutboundPort != 16001 || a.spec.PodID != "p" {
		t.Errorf("defaults not applied: %+v", a.spec)
	}
}

// The TPROXY target: unset takes the daemon default, "" is none, an
// address is taken; the record keeps it, and the API shows it.
func TestValidateTProxyTarget(t *testing.T) {
	d := nft.DefaultSpec("")
	d.TProxyAddrV6 = netip.MustParseAddr("fd00::1")
	for _, tc := range []struct {
		name   string
		v4, v6 *string
		want4  string
		want6  string
	}{
		{"unset", nil, nil, "127.0.0.1", "fd00::1"},
		{"none", proto.String(""), proto.String(""), "", ""},
		{"given", proto.String("10.244.1.7"), proto.String("::1"), "10.244.1.7", "::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := validAdd()
			req.Options.TproxyIpv4, req.Options.TproxyIpv6 = tc.v4, tc.v6
			a, err := validateAdd(req, d)
			if err != nil {
				t.Fatal(err)
			}
			if got := addrText(a.spec.TProxyAddrV4); got != tc.want4 {
				t.Errorf("tproxy v4 = %q, want %q", got, tc.want4)
			}
			if got := addrText(a.spec.TProxyAddrV6); got != tc.want6 {
				t.Errorf("tproxy v6 = %q, want %q", got, tc.want6)
			}
			rec := &state.Record{PodUID: req.PodUid, Spec: state.SpecOf(a.spec)}
			back, err := rec.Spec.Spec(req.PodUid)
			if err != nil {
				t.Fatal(err)
			}
			if back.TProxyAddrV4 != a.spec.TProxyAddrV4 || back.TProxyAddrV6 != a.spec.TProxyAddrV6 {
				t.Errorf("record round trip: %v %v, want %v %v", back.TProxyAddrV4, back.TProxyAddrV6, a.spec.TProxyAddrV4, a.spec.TProxyAddrV6)
			}
			opts := podProto(rec).GetOptions()
			if opts.TproxyIpv4 == nil || opts.GetTproxyIpv4() != tc.want4 || opts.TproxyIpv6 == nil || opts.GetTproxyIpv6() != tc.want6 {
				t.Errorf("API options show %v %v, want %q %q", opts.TproxyIpv4, opts.TproxyIpv6, tc.want4, tc.want6)
			}
			if _, err := nft.Build(a.spec); err != nil {
				t.Errorf("a validated request must build: %v", err)
			}
		})
	}
}

func addrText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func TestValidateUID(t *testing.T) {
	if err := validateUID(""); Classify(err).Kind != KindInvalid {
		t.Errorf("empty uid: %v", err)
	}
	if err := validateUID("ok-uid"); err != nil {
		t.Errorf("good uid: %v", err)
	}
}
