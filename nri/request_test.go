package nri_test

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/nftredir/nftredir/nri"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// What the runtime says of a sandbox becomes the AddPod a CNI ADD of it
// would make; what it does not say (service account, options) the policy
// fills in.
func TestAddPodRequest(t *testing.T) {
	pod := sandbox("mesh", "web", "10.1.0.5", "fd00::5")
	pod.Labels = map[string]string{"app": "web"}
	pod.Annotations = map[string]string{"nftredir.io/dns-capture": "false"}
	got, skip := nri.AddPodRequest(pod)
	want := &nftredirv1.AddPodRequest{
		PodUid:       "uid-mesh-web",
		PodName:      "web",
		PodNamespace: "mesh",
		NetnsPath:    "/var/run/netns/cni-mesh-web",
		PodIps:       []string{"10.1.0.5", "fd00::5"},
	}
	if skip != "" || !cmp.Equal(got, want, protocmp.Transform()) {
		t.Errorf("AddPodRequest = %v (%q); want %v", got, skip, want)
	}
	if got := nri.RemovePodRequest(pod); !cmp.Equal(got, &nftredirv1.RemovePodRequest{PodUid: "uid-mesh-web", NetnsPath: "/var/run/netns/cni-mesh-web", NamespaceTeardown: true}, protocmp.Transform()) {
		t.Errorf("RemovePodRequest = %v", got)
	}
}

// A sandbox without a network namespace of its own (host network, or
// torn down already) or without a pod UID is none of nftredir's business.
func TestAddPodRequestLeavesAlone(t *testing.T) {
	host := sandbox("mesh", "host")
	host.Linux.Namespaces = []*api.LinuxNamespace{{Type: "ipc"}, {Type: "uts"}}
	noLinux := sandbox("mesh", "nolinux")
	noLinux.Linux = nil
	noUID := sandbox("mesh", "crictl")
	noUID.Uid = ""
	for _, pod := range []*api.PodSandbox{host, noLinux, noUID} {
		if req, skip := nri.AddPodRequest(pod); req != nil || skip == "" {
			t.Errorf("AddPodRequest(%s) = %v, %q; want nil and why", pod.Name, req, skip)
		}
		if req := nri.RemovePodRequest(pod); req != nil {
			t.Errorf("RemovePodRequest(%s) = %v; want nil", pod.Name, req)
		}
	}
}
