package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

// The results of 0.3.x networks, in the shape each primary plugin prints
// them (the bridge and ptp reference plugins, Calico, Cilium; Flannel
// prints its delegate bridge's result, Multus its cluster network's). 0.3.x
// IPs carry "version", which 1.0.0 dropped. want is what the pod must be
// enrolled with: addresses on interfaces inside the sandbox or on none,
// never a host-side one.
var results03 = []struct {
	name, prev string
	want       []string
}{
	{"bridge-0.3.0", `{
		"cniVersion": "0.3.0",
		"interfaces": [
			{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
			{"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
			{"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/pod1"}
		],
		"ips": [
			{"version": "4", "interface": 2, "address": "10.22.0.5/24", "gateway": "10.22.0.1"},
			{"version": "6", "interface": 2, "address": "fd00:22::5/64", "gateway": "fd00:22::1"},
			{"version": "4", "interface": 0, "address": "10.22.0.1/24"}
		],
		"routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
		"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
	}`, []string{"10.22.0.5", "fd00:22::5"}},
	{"flannel-bridge-0.3.1", `{
		"cniVersion": "0.3.1",
		"interfaces": [
			{"name": "cni0", "mac": "62:9e:0b:1a:2b:01"},
			{"name": "veth0a1b2c3d", "mac": "3e:51:90:aa:bb:02"},
			{"name": "eth0", "mac": "b6:2f:6e:cc:dd:03", "sandbox": "/var/run/netns/cni-1b2c"}
		],
		"ips": [{"version": "4", "interface": 2, "address": "10.244.1.5/24", "gateway": "10.244.1.1"}],
		"routes": [{"dst": "10.244.0.0/16"}, {"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
		"dns": {}
	}`, []string{"10.244.1.5"}},
	{"calico-0.3.1", `{
		"cniVersion": "0.3.1",
		"interfaces": [{"name": "cali5d8a1b2c3e4"}],
		"ips": [
			{"version": "4", "address": "192.168.171.5/32"},
			{"version": "6", "address": "fd00:10:244::5/128"}
		],
		"dns": {}
	}`, []string{"192.168.171.5", "fd00:10:244::5"}},
	{"cilium-0.3.1", `{
		"cniVersion": "0.3.1",
		"interfaces": [
			{"name": "lxc8d1f2e3a4b5c", "mac": "0e:1f:2a:3b:4c:01"},
			{"name": "eth0", "mac": "6a:7b:8c:9d:0e:02", "sandbox": "/var/run/netns/cni-3c4d"}
		],
		"ips": [{"version": "4", "interface": 1, "address": "10.0.1.57/32", "gateway": "10.0.1.200"}],
		"routes": [{"dst": "0.0.0.0/0", "gw": "10.0.1.200"}],
		"dns": {}
	}`, []string{"10.0.1.57"}},
	{"kindnet-ptp-0.3.1", `{
		"cniVersion": "0.3.1",
		"interfaces": [
			{"name": "veth5e6f7a8b", "mac": "ca:11:22:33:44:01"},
			{"name": "eth0", "mac": "ca:11:22:33:44:02", "sandbox": "/var/run/netns/cni-5e6f"}
		],
		"ips": [{"version": "4", "interface": 1, "address": "10.244.0.5/24", "gateway": "10.244.0.1"}],
		"routes": [{"dst": "0.0.0.0/0"}],
		"dns": {}
	}`, []string{"10.244.0.5"}},
}

// A 0.3.x network gets what any other does: the pod enrolled with the
// sandbox's addresses, the previous result printed back unchanged in the
// config's version, and DEL (which carries no prevResult below 0.4.0)
// releasing it.
func TestCNI03xAddDel(t *testing.T) {
	for _, tc := range results03 {
		var v struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal([]byte(tc.prev), &v); err != nil {
			t.Fatal(err)
		}
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// Through skel, as a runtime runs it: skel refuses a version
			// the plugin does not declare before the plugin sees it.
			out, ok := execPlugin(t, "ADD", e.conf(t, v.CNIVersion, tc.prev, nil))
			if !ok {
				t.Fatalf("ADD: %s", out)
			}
			if diff := cmp.Diff(jsonValue(t, tc.prev), jsonValue(t, out)); diff != "" {
				t.Errorf("printed result differs from prevResult (-prev +printed):\n%s", diff)
			}
			pod := e.fake.Pod("uid-1")
			if pod == nil {
				t.Fatal("pod not enrolled")
			}
			if !slices.Equal(pod.GetPodIps(), tc.want) {
				t.Errorf("enrolled with IPs %v, want %v", pod.GetPodIps(), tc.want)
			}
			if out, ok := execPlugin(t, "DEL", e.conf(t, v.CNIVersion, "", nil)); !ok {
				t.Fatalf("DEL: %s", out)
			}
			if e.fake.Pod("uid-1") != nil {
				t.Error("DEL left the pod enrolled")
			}
		})
	}
}

// A 0.3.0 result under a 0.3.1 config (a primary plugin that prints the
// older version) is printed as 0.3.1, otherwise unchanged.
func TestCNI03xResultConvertedToConfigVersion(t *testing.T) {
	e := newEnv(t)
	prev := results03[0].prev
	e.add(t, args(e.conf(t, "0.3.1", prev, nil), "ctr1", "/run/netns/pod1", k8sArgs1))
	want := jsonValue(t, prev).(map[string]any)
	want["cniVersion"] = "0.3.1"
	if diff := cmp.Diff(want, jsonValue(t, e.stdout.String())); diff != "" {
		t.Errorf("(-want +printed):\n%s", diff)
	}
}

// execPluginEnv makes the test binary run as the plugin binary does:
// skel dispatching to the plugin, with the plugin's Versions. Commands
// gated by version are only seen through skel.
const execPluginEnv = "NFTREDIR_CNI_TEST_EXEC_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(execPluginEnv) == "1" {
		skel.PluginMainFuncs(New().Funcs(), Versions, "nftredir-cni under test")
		os.Exit(0)
	}
	code := m.Run()
	removeHelperBinary()
	os.Exit(code)
}

// execPlugin runs the plugin as a runtime does: CNI_COMMAND and the config
// on stdin. It returns stdout and whether the exit status was 0.
func execPlugin(t *testing.T, command string, conf []byte) (string, bool) {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run=^$")
	// CNI_NETNS_OVERRIDE: skel would otherwise open CNI_NETNS after ADD
	// and DEL to check it is not its own; these tests have no namespace.
	c.Env = append(os.Environ(), execPluginEnv+"=1", "CNI_COMMAND="+command, "CNI_PATH=/opt/cni/bin",
		"CNI_CONTAINERID=ctr1", "CNI_NETNS=/run/netns/pod1", "CNI_IFNAME=eth0", "CNI_ARGS="+k8sArgs1,
		"CNI_NETNS_OVERRIDE=1")
	c.Stdin = bytes.NewReader(conf)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run the plugin: %v", err)
	}
	return out.String(), err == nil
}

// Each command is offered only from the version that has it: CHECK from
// 0.4.0, STATUS and GC from 1.1.0. Below that the runtime gets the spec's
// code 2 (incompatible CNI version) and the plugin is never called; at
// and above it the command reaches the plugin (here CHECK fails with code
// 101, the pod not being enrolled, which only the plugin can say).
func TestCNIVersionGates(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		command, version string
		wantCode         uint
	}{
		{"CHECK", "0.3.0", types.ErrIncompatibleCNIVersion},
		{"CHECK", "0.3.1", types.ErrIncompatibleCNIVersion},
		{"CHECK", "0.4.0", ErrNotCaptured},
		{"CHECK", "1.0.0", ErrNotCaptured},
		{"STATUS", "0.3.1", types.ErrIncompatibleCNIVersion},
		{"STATUS", "1.0.0", types.ErrIncompatibleCNIVersion},
		{"GC", "0.3.1", types.ErrIncompatibleCNIVersion},
		{"GC", "1.0.0", types.ErrIncompatibleCNIVersion},
		{"ADD", "0.2.0", types.ErrIncompatibleCNIVersion},
	} {
		prev := ""
		if tc.command == "CHECK" || tc.command == "ADD" {
			prev = `{"cniVersion":"` + tc.version + `","ips":[{"version":"4","address":"10.22.0.5/24"}]}`
		}
		out, ok := execPlugin(t, tc.command, e.conf(t, tc.version, prev, nil))
		if ok {
			t.Errorf("%s at %s succeeded: %s", tc.command, tc.version, out)
			continue
		}
		var ce types.Error
		if err := json.Unmarshal([]byte(out), &ce); err != nil {
			t.Errorf("%s at %s: stdout is not a CNI error: %q", tc.command, tc.version, out)
			continue
		}
		if ce.Code != tc.wantCode {
			t.Errorf("%s at %s: code %d %q, want code %d", tc.command, tc.version, ce.Code, ce.Msg, tc.wantCode)
		}
	}
	// The gated commands never reached the daemon; the two CHECKs did.
	if n := e.fake.Calls("GetPod"); n != 2 {
		t.Errorf("daemon got %d GetPod calls, want 2 (CHECK at 0.4.0 and 1.0.0)", n)
	}
	if n := e.fake.Calls("ListPods") + e.fake.Calls("AddPod"); n != 0 {
		t.Errorf("daemon got %d ListPods/AddPod calls from gated commands", n)
	}

	out, ok := execPlugin(t, "VERSION", []byte(`{"cniVersion":"0.3.1"}`))
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if !ok || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("VERSION: %v %q", ok, out)
	}
	if got := strings.Join(v.Supported, ","); got != "0.3.0,0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Errorf("VERSION lists %s", got)
	}
}
