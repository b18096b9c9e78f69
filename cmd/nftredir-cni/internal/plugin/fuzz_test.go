package plugin

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzParseConf: any stdin either parses or fails with a CNI decoding (6)
// or configuration (7) error; what parses has absolute paths and a
// positive timeout; and a config ADD accepts is never one DEL (which
// skips the options) refuses, so every pod stays deletable.
func FuzzParseConf(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","type":"nftredir-cni"}`), true)
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","type":"nftredir-cni","socket":"/run/nftredir/nftredir.sock","timeout":"10s",`+
		`"excludeNamespaces":["kube-system"],"logFile":"/var/log/nftredir/cni.log","logLevel":"info","captureMode":"REDIRECT",`+
		`"excludeInboundPorts":[8080,"15021"],"excludeOutboundPorts":[53],"excludeOutboundCIDRs":["169.254.169.254/32","fd00::/8"],`+
		`"dnsCapture":true,"ipv6":"false","inboundCapture":false,"cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}],`+
		`"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24"}]}}`), true)
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nftredir-cni","captureMode":7,"timeout":"-1s"}`), false)
	f.Fuzz(func(t *testing.T, data []byte, withOptions bool) {
		c, _, err := ParseConf(data, withOptions)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || (te.Code != types.ErrDecodingFailure && te.Code != types.ErrInvalidNetworkConfig) {
				t.Fatalf("error %v (%T) is not a CNI decoding or config error", err, err)
			}
			return
		}
		if !filepath.IsAbs(c.Socket) || !filepath.IsAbs(c.DataDir) || (c.LogFile != "" && !filepath.IsAbs(c.LogFile)) {
			t.Fatalf("accepted relative paths: socket %q dataDir %q logFile %q", c.Socket, c.DataDir, c.LogFile)
		}
		if c.Timeout <= 0 {
			t.Fatalf("accepted timeout %v", c.Timeout)
		}
		if withOptions {
			if _, _, err := ParseConf(data, false); err != nil {
				t.Fatalf("ADD accepts the config but DEL refuses it: %v", err)
			}
		}
	})
}

// FuzzParseIdentity: any CNI_ARGS either parses or fails with the CNI
// code for bad environment variables; a parsed identity has a key, the
// pod uid when the runtime sent one and the container id otherwise.
func FuzzParseIdentity(f *testing.F) {
	f.Add("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=7d0f", "abc")
	f.Add("K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0", "c1")
	f.Add("FOO=bar", "c1")
	f.Add("", "c1")
	f.Add("IgnoreUnknown=true;=;K8S_POD_UID=", "c2")
	f.Fuzz(func(t *testing.T, cniArgs, containerID string) {
		id, err := ParseIdentity(cniArgs, containerID)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables {
				t.Fatalf("error %v (%T) is not ErrInvalidEnvironmentVariables", err, err)
			}
			return
		}
		switch id.Source {
		case KeyPodUID:
			if id.Key == "" || !strings.Contains(cniArgs, "K8S_POD_UID="+id.Key) {
				t.Fatalf("key %q from K8S_POD_UID is not in %q", id.Key, cniArgs)
			}
		case KeyContainerID:
			if id.Key != containerID {
				t.Fatalf("container-id key %q, container id %q", id.Key, containerID)
			}
		default:
			t.Fatalf("unknown key source %q", id.Source)
		}
	})
}
