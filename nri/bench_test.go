package nri_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftredir/nftredir/nri"
)

// BenchmarkSynchronize times the whole Synchronize of a full node (the
// kubelet's default of 110 pods, a third of them in the mesh), which
// must fit in the runtime's one request timeout (2s by default): cold,
// every mesh pod started while the daemon was away and is enrolled now;
// warm, a reconnection that finds them enrolled through their namespaces.
// On the in-memory capture engine: the kernel's part is AddPod's, which
// BenchmarkAddPod and make bench time.
func BenchmarkSynchronize(b *testing.B) {
	const pods = 110
	var objs []*corev1.Pod
	var sandboxes []*api.PodSandbox
	for i := range pods {
		ns := "plain"
		if i%3 == 0 {
			ns = "mesh"
		}
		name := fmt.Sprintf("p%d", i)
		objs = append(objs, apiPod(ns, name, nil))
		sandboxes = append(sandboxes, sandbox(ns, name, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)))
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			d := startDaemon(b, objs...)
			p, err := nri.New(nri.Config{Pods: d.pods})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := p.Synchronize(context.Background(), sandboxes, nil); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			d.stop()
			b.StartTimer()
		}
	})
	b.Run("warm", func(b *testing.B) {
		d := startDaemon(b, objs...)
		defer d.stop()
		p, err := nri.New(nri.Config{Pods: d.pods})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Synchronize(context.Background(), sandboxes, nil); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := p.Synchronize(context.Background(), sandboxes, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRunPodSandbox is the runtime's RunPodSandbox round trip over
// the NRI socket (the NRI project's runtime library on one end, the
// plugin on the other), for a pod the policy leaves alone and for a pod
// already enrolled through its namespace (a CNI ADD of the same sandbox
// did it). In-memory capture engine: a captured pod's kernel work is
// AddPod's, timed elsewhere.
func BenchmarkRunPodSandbox(b *testing.B) {
	d := startDaemon(b, apiPod("plain", "db", nil), apiPod("mesh", "web", nil))
	rt := startRuntime(b, "containerd", "v2.4.2", "")
	if err := d.connect(b, rt, nil); err != nil {
		b.Fatal(err)
	}
	db, web := sandbox("plain", "db", "10.1.0.6"), sandbox("mesh", "web", "10.1.0.5")
	if err := rt.runPodSandbox(web); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		pod  *api.PodSandbox
	}{{"not-captured", db}, {"enrolled-already", web}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := rt.r.RunPodSandbox(context.Background(), &api.RunPodSandboxRequest{Pod: c.pod}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
