package nri

import (
	"github.com/containerd/nri/pkg/api"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// networkNamespace is the type NRI gives a pod's network namespace among
// its Linux namespaces.
const networkNamespace = "network"

// NetnsPath is the path of the sandbox's network namespace, or "" when it
// has none of its own: a pod on the host network, or a sandbox whose
// namespace the runtime has already torn down (the runtime leaves out
// paths that no longer exist).
func NetnsPath(pod *api.PodSandbox) string {
	for _, ns := range pod.GetLinux().GetNamespaces() {
		if ns.GetType() == networkNamespace {
			return ns.GetPath()
		}
	}
	return ""
}

// AddPodRequest is the AddPod a CNI ADD of the same sandbox would make:
// the pod's UID, name and namespace, its network namespace, and the
// addresses the network plugins gave it. The policy fills in the rest
// from the Kubernetes API, as for the CNI ADD. It returns nil and why
// when the sandbox is none of nftredir's business: no namespace of its
// own (host network), or no pod UID (a sandbox made outside Kubernetes,
// e.g. by crictl runp without metadata).
func AddPodRequest(pod *api.PodSandbox) (*nftredirv1.AddPodRequest, string) {
	path := NetnsPath(pod)
	switch {
	case path == "":
		return nil, "the sandbox has no network namespace of its own (host network, or already torn down)"
	case pod.GetUid() == "":
		return nil, "the sandbox has no pod UID: not a Kubernetes pod"
	}
	return &nftredirv1.AddPodRequest{
		PodUid:       pod.GetUid(),
		PodName:      pod.GetName(),
		PodNamespace: pod.GetNamespace(),
		NetnsPath:    path,
		PodIps:       pod.GetIps(),
	}, ""
}

// RemovePodRequest is the release a CNI DEL of the sandbox would make: of
// the pod only as enrolled through this sandbox's namespace (a newer
// sandbox of the same pod keeps its capture), leaving the namespace to
// the runtime, which deletes it next. nil when the sandbox has no
// namespace left: whatever of it was captured went with it.
func RemovePodRequest(pod *api.PodSandbox) *nftredirv1.RemovePodRequest {
	path := NetnsPath(pod)
	if path == "" || pod.GetUid() == "" {
		return nil
	}
	return &nftredirv1.RemovePodRequest{PodUid: pod.GetUid(), NetnsPath: path, NamespaceTeardown: true}
}
