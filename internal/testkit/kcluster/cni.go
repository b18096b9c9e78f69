package kcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// writeConflist writes the cluster's network: the bridge plugin and then
// more (e.g. nftredir-cni's configuration), atomically, so containerd's
// watcher never reads half a file.
func (c *Cluster) writeConflist(more ...any) error {
	plugins := append([]any{c.BridgePlugin()}, more...)
	b, err := json.MarshalIndent(map[string]any{"cniVersion": c.ConflistVersion, "name": "kcluster", "plugins": plugins}, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(c.CNIConfDir, ConflistName)
	tmp := filepath.Join(c.CNIConfDir, ".tmp-"+ConflistName)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	c.conflist = b
	return nil
}

// WriteConflist replaces the node's CNI network with bridge + host-local
// followed by more plugins (each a JSON-marshalable plugin configuration),
// and waits until containerd has loaded it, so the next pod sandbox uses
// it.
func (c *Cluster) WriteConflist(t testing.TB, more ...any) {
	t.Helper()
	if err := c.writeConflist(more...); err != nil {
		t.Fatal(err)
	}
	if err := c.waitConflistLoaded(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// Conflist returns the network configuration last written.
func (c *Cluster) Conflist() []byte { return bytes.Clone(c.conflist) }

// InstallCNIPlugin links a plugin binary into CNIBinDir under name.
func (c *Cluster) InstallCNIPlugin(t testing.TB, name, binary string) {
	t.Helper()
	dst := filepath.Join(c.CNIBinDir, name)
	os.Remove(dst)
	if err := os.Symlink(binary, dst); err != nil {
		t.Fatal(err)
	}
}

// CRI returns a client of the node's CRI runtime service (containerd), for
// observing sandboxes and containers as the kubelet sees them. It is closed
// when the test ends.
func (c *Cluster) CRI(t testing.TB) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := c.criConn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

func (c *Cluster) criConn() (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+c.ContainerdSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// waitConflistLoaded polls the CRI status until containerd reports the
// file last written as its network configuration.
func (c *Cluster) waitConflistLoaded(ctx context.Context) error {
	conn, err := c.criConn()
	if err != nil {
		return err
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	want := c.conflist
	return c.waitUntil(ctx, "containerd to load "+ConflistName, func(ctx context.Context) (bool, error) {
		src, err := LoadedConflist(ctx, rs)
		if err != nil {
			return false, err
		}
		if src != string(want) {
			return false, fmt.Errorf("containerd has not loaded %s yet", ConflistName)
		}
		return true, nil
	})
}

// LoadedConflist returns the cluster network's configuration as containerd
// has loaded it (its CRI status), which may trail the file on disk.
func LoadedConflist(ctx context.Context, rs runtimeapi.RuntimeServiceClient) (string, error) {
	st, err := rs.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return "", err
	}
	var info struct {
		Networks []struct {
			Config struct {
				Name   string
				Source string
			}
		}
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["cniconfig"]), &info); err != nil {
		return "", fmt.Errorf("CRI status cniconfig: %w", err)
	}
	for _, n := range info.Networks {
		if n.Config.Name == "kcluster" {
			return n.Config.Source, nil
		}
	}
	return "", fmt.Errorf("containerd has no network kcluster loaded")
}

// waitContainerd waits until containerd's CRI answers.
func (c *Cluster) waitContainerd(ctx context.Context) error {
	conn, err := c.criConn()
	if err != nil {
		return err
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	return c.waitUntil(ctx, "containerd", func(ctx context.Context) (bool, error) {
		_, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
		return err == nil, err
	})
}
