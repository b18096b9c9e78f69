package kcluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StopNode does to the node what a reboot without drain does: the kubelet
// and containerd end without stopping a pod, every container dies, and
// what lives on tmpfs goes: each sandbox's network namespace pin
// (/var/run/netns), containerd's state directory (/run/containerd) and
// runc's root. What a reboot keeps stays: the API's pods (still Running
// there), containerd's root (its metadata names the old sandboxes, which
// come back NOTREADY) and the kubelet's directory. StartNode boots it.
func (c *Cluster) StopNode(t testing.TB) {
	t.Helper()
	pins := c.sandboxPins()
	if err := c.procs["kubelet"].kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.procs["containerd"].kill(); err != nil {
		t.Fatal(err)
	}
	// Down, not dead: the cluster's waits fail on a component that died.
	c.procs["kubelet"], c.procs["containerd"] = nil, nil
	c.killShims()
	c.deleteRuncContainers()
	for _, pin := range pins {
		if _, err := os.Stat(pin); err == nil {
			unix.Unmount(pin, unix.MNT_DETACH)
			if err := os.Remove(pin); err != nil {
				t.Fatalf("remove sandbox namespace pin: %v", err)
			}
		}
	}
	for _, dir := range []string{filepath.Join(c.Dir, "containerd", "state"), c.runcRoot} {
		for _, mp := range mountsUnder(dir) {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
		if mps := mountsUnder(dir); len(mps) > 0 {
			t.Fatalf("mounts left under %s: %v", dir, mps)
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("kcluster: node stopped as by a reboot; %d sandbox namespace pins removed", len(pins))
}

// StartNode starts containerd and then the kubelet again after StopNode
// and waits until the node is Ready.
func (c *Cluster) StartNode(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), DefaultTimeout)
	defer cancel()
	if err := c.startContainerd(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.startKubelet(); err != nil {
		t.Fatal(err)
	}
	err := c.waitUntil(ctx, "node Ready after restart", func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return nodeReady(n), nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sandboxPins is the network namespace pin of every sandbox the runtime
// knows.
func (c *Cluster) sandboxPins() []string { return c.walkSandboxes(nil) }

// RestartContainerd restarts the node's containerd alone, as a service
// manager does on an upgrade or a config change: SIGTERM, then a new
// containerd on the same root and state. Shims and containers keep
// running and the new containerd takes them back; the kubelet stays up
// and reconnects. NRI plugins lose their connection and must connect
// again: containerd forgets them, and with its validator on, a required
// plugin counts as missing until it is back.
func (c *Cluster) RestartContainerd(t testing.TB) {
	t.Helper()
	if err := c.procs["containerd"].stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), DefaultTimeout)
	defer cancel()
	if err := c.startContainerd(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitContainerd(ctx); err != nil {
		t.Fatal(err)
	}
}
