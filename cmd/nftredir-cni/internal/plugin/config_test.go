package plugin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/rpc"
)

func TestCNIParseConfDefaults(t *testing.T) {
	c, unknown, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"net","type":"nftredir-cni"}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) > 0 {
		t.Errorf("unknown keys %v", unknown)
	}
	want := Conf{
		Socket:   "/run/nftredir/nftredir.sock",
		Timeout:  10 * time.Second,
		DataDir:  "/var/lib/cni/nftredir",
		LogLevel: hclog.Info,
	}
	got := *c
	got.PluginConf = types.PluginConf{}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if c.Options != nil {
		t.Errorf("no options configured, but Options = %v; unset must mean daemon defaults", c.Options)
	}
}

func TestCNIParseConfFull(t *testing.T) {
	c, unknown, err := ParseConf([]byte(`{
		"cniVersion": "1.0.0", "name": "net", "type": "nftredir-cni",
		"socket": "/tmp/d.sock", "timeout": "2.5s", "dataDir": "/tmp/data",
		"captureMode": "redirect",
		"excludeInboundPorts": [15021, 8080],
		"excludeOutboundPorts": [5432],
		"excludeOutboundCIDRs": ["10.0.0.0/8", "169.254.169.254", "fd00::/8"],
		"dnsCapture": false, "ipv6": true, "inboundCapture": false,
		"rerouteVirtualInterfaces": ["k6t-eth0", "tap0"],
		"excludeNamespaces": ["kube-system", "istio-system"],
		"logFile": "/tmp/log/cni.log", "logLevel": "debug",
		"runtimeConfig": {}, "args": {}, "capabilities": {"portMappings": true},
		"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}],
		"cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth1"}],
		"exclude_inbound_ports": [1]
	}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"exclude_inbound_ports"}, unknown); diff != "" {
		t.Errorf("unknown keys (-want +got):\n%s", diff)
	}
	if c.Socket != "/tmp/d.sock" || c.Timeout != 2500*time.Millisecond || c.DataDir != "/tmp/data" ||
		c.LogFile != "/tmp/log/cni.log" || c.LogLevel != hclog.Debug {
		t.Errorf("settings: %+v", c)
	}
	if !c.Excluded("kube-system") || c.Excluded("default") || c.Excluded("") {
		t.Errorf("Excluded wrong for %v", c.ExcludeNamespaces)
	}
	no, yes := false, true
	wantOpts := &rpc.Options{
		CaptureMode:          rpc.CaptureModeREDIRECT,
		ExcludeInboundPorts:  []uint32{15021, 8080},
		ExcludeOutboundPorts: []uint32{5432},
		ExcludeOutboundCIDRs: []string{"10.0.0.0/8", "169.254.169.254", "fd00::/8"},
		DNSCapture:           &no,
		IPv6:                 &yes,
		InboundCapture:       &no,
		// Names as given: the daemon checks, sorts and deduplicates them.
		RerouteVirtualInterfaces: []string{"k6t-eth0", "tap0"},
	}
	if diff := cmp.Diff(wantOpts, c.Options); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
	wantAtt := []types.GCAttachment{{ContainerID: "a", IfName: "eth0"}, {ContainerID: "b", IfName: "eth1"}}
	if diff := cmp.Diff(wantAtt, c.ValidAttachments); diff != "" {
		t.Errorf("attachments: union of both keys, deduplicated (-want +got):\n%s", diff)
	}
}

func TestCNIParseConfErrors(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		code       uint
		want       string // in the message
	}{
		{"not json", `{`, types.ErrDecodingFailure, "decode network config"},
		{"mode", `"captureMode": "ebpf"`, types.ErrInvalidNetworkConfig, `captureMode "ebpf" is not TPROXY or REDIRECT`},
		{"mode type", `"captureMode": 1`, types.ErrInvalidNetworkConfig, "captureMode"},
		{"port zero", `"excludeInboundPorts": [0]`, types.ErrInvalidNetworkConfig, "excludeInboundPorts: 0 is not a port number"},
		{"port big", `"excludeOutboundPorts": [65536]`, types.ErrInvalidNetworkConfig, "excludeOutboundPorts: 65536 is not a port"},
		{"port negative", `"excludeInboundPorts": [-1]`, types.ErrInvalidNetworkConfig, "-1 is not a port"},
		{"port fraction", `"excludeInboundPorts": [80.5]`, types.ErrInvalidNetworkConfig, "80.5 is not a port"},
		{"port string", `"excludeInboundPorts": ["80"]`, types.ErrInvalidNetworkConfig, `"80" is not a port`},
		{"ports not list", `"excludeInboundPorts": 80`, types.ErrInvalidNetworkConfig, "want a list of port numbers"},
		{"ports null", `"excludeInboundPorts": null`, types.ErrInvalidNetworkConfig, "null is not allowed"},
		{"cidr", `"excludeOutboundCIDRs": ["10.0.0.0/33"]`, types.ErrInvalidNetworkConfig, `"10.0.0.0/33" is not a CIDR`},
		{"cidr word", `"excludeOutboundCIDRs": ["metadata"]`, types.ErrInvalidNetworkConfig, `"metadata" is not a CIDR`},
		{"cidr zone", `"excludeOutboundCIDRs": ["fe80::1%eth0"]`, types.ErrInvalidNetworkConfig, "is not a CIDR"},
		{"bool", `"dnsCapture": "yes"`, types.ErrInvalidNetworkConfig, "dnsCapture"},
		{"reroute not list", `"rerouteVirtualInterfaces": "k6t-eth0"`, types.ErrInvalidNetworkConfig, "rerouteVirtualInterfaces: json: cannot unmarshal string"},
		{"reroute null", `"rerouteVirtualInterfaces": null`, types.ErrInvalidNetworkConfig, "rerouteVirtualInterfaces: null is not allowed"},
		{"reroute empty name", `"rerouteVirtualInterfaces": ["tap0", ""]`, types.ErrInvalidNetworkConfig, `rerouteVirtualInterfaces: "" is not an interface name`},
		{"reroute space", `"rerouteVirtualInterfaces": ["tap 0"]`, types.ErrInvalidNetworkConfig, `"tap 0" is not an interface name`},
		{"timeout", `"timeout": "10"`, types.ErrInvalidNetworkConfig, `timeout "10" is not a duration`},
		{"timeout negative", `"timeout": "-1s"`, types.ErrInvalidNetworkConfig, "must be positive"},
		{"socket relative", `"socket": "run/x.sock"`, types.ErrInvalidNetworkConfig, "must be an absolute path"},
		{"socket type", `"socket": 5`, types.ErrInvalidNetworkConfig, "decode nftredir-cni settings"},
		{"log level", `"logLevel": "loud"`, types.ErrInvalidNetworkConfig, `logLevel "loud"`},
		{"log file", `"logFile": "cni.log"`, types.ErrInvalidNetworkConfig, "logFile"},
		{"namespace", `"excludeNamespaces": [""]`, types.ErrInvalidNetworkConfig, "excludeNamespaces"},
		{"attachments", `"cni.dev/valid-attachments": {}`, types.ErrDecodingFailure, "decode network config"},
		{"old attachments", `"cni.dev/attachments": {}`, types.ErrInvalidNetworkConfig, "cni.dev/attachments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := tc.conf
			if conf != `{` {
				conf = `{"cniVersion":"1.1.0","name":"net","type":"nftredir-cni",` + conf + `}`
			}
			_, _, err := ParseConf([]byte(conf), true)
			e := asCNI(t, err)
			if e.Code != tc.code || !strings.Contains(e.Msg, tc.want) {
				t.Errorf("got code %d %q; want code %d containing %q", e.Code, e.Msg, tc.code, tc.want)
			}
		})
	}
}

func TestCNIParseConfReportsEveryProblem(t *testing.T) {
	_, _, err := ParseConf([]byte(`{"name":"net","captureMode":"x","excludeInboundPorts":[0],"timeout":"x"}`), true)
	e := asCNI(t, err)
	for _, want := range []string{"captureMode", "excludeInboundPorts", "timeout", `network "net"`} {
		if !strings.Contains(e.Msg, want) {
			t.Errorf("message %q lacks %q", e.Msg, want)
		}
	}
}

// A broken capture option must not make a pod undeletable: only ADD reads
// the options.
func TestCNIParseConfWithoutOptionsIgnoresThem(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"net","captureMode":"ebpf","excludeInboundPorts":"x"}`)
	if _, _, err := ParseConf(conf, false); err != nil {
		t.Fatalf("DEL-style parse: %v", err)
	}
	if _, _, err := ParseConf(conf, true); err == nil {
		t.Fatal("ADD-style parse accepted a broken option")
	}
}

func TestCNIParseIdentity(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		want       Identity
		wantErr    string
	}{
		{
			name: "kubernetes",
			args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0b5c8f3e-4c1d",
			want: Identity{Key: "0b5c8f3e-4c1d", Source: KeyPodUID, Namespace: "shop", Name: "cart-0"},
		},
		{
			name: "unknown keys tolerated",
			args: "IgnoreUnknown=true;K8S_POD_UID=u1;SOMETHING_ELSE=x",
			want: Identity{Key: "u1", Source: KeyPodUID},
		},
		{
			name: "no args",
			args: "",
			want: Identity{Key: "ctr1", Source: KeyContainerID},
		},
		{
			name: "names but no uid",
			args: "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0",
			want: Identity{Key: "ctr1", Source: KeyContainerID, Namespace: "shop", Name: "cart-0"},
		},
		{name: "unknown key", args: "FOO=bar", wantErr: "unknown args"},
		{name: "malformed", args: "K8S_POD_UID", wantErr: "invalid pair"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseIdentity(tc.args, "ctr1")
			if tc.wantErr != "" {
				e := asCNI(t, err)
				if e.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(e.Details, tc.wantErr) {
					t.Errorf("got %d %q %q; want code 4 with %q", e.Code, e.Msg, e.Details, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func asCNI(t *testing.T, err error) *types.Error {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("%v (%T) is not a CNI error", err, err)
	}
	return e
}

// The examples under deploy/cni are what docs/cni.md tells people to
// install; they must parse cleanly, with no key the plugin does not know.
func TestCNIDeployExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "deploy", "cni")
	b, err := os.ReadFile(filepath.Join(dir, "10-nftredir.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("10-nftredir.conflist: %v", err)
	}
	if n := len(list.Plugins); n < 2 || list.Plugins[n-1]["type"] != "nftredir-cni" {
		t.Fatalf("10-nftredir.conflist: nftredir-cni must come last, after a plugin that assigns IPs: %v", list.Plugins)
	}
	inline := list.Plugins[len(list.Plugins)-1]

	b, err = os.ReadFile(filepath.Join(dir, "99-nftredir.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var dropIn map[string]any
	if err := json.Unmarshal(b, &dropIn); err != nil {
		t.Fatalf("99-nftredir.conf: %v", err)
	}
	if diff := cmp.Diff(inline, dropIn); diff != "" {
		t.Errorf("the drop-in and the conflist's entry differ (-conflist +drop-in):\n%s", diff)
	}
	// What libcni hands the plugin: the entry plus name and cniVersion.
	dropIn["name"], dropIn["cniVersion"] = list.Name, list.CNIVersion
	b, _ = json.Marshal(dropIn)
	if _, unknown, err := ParseConf(b, true); err != nil || len(unknown) > 0 {
		t.Errorf("ParseConf: %v, unknown keys %v", err, unknown)
	}
}
