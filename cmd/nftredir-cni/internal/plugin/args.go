package plugin

import (
	"github.com/containernetworking/cni/pkg/types"
)

// k8sArgs are the CNI_ARGS Kubernetes runtimes pass. The field names are
// the keys, which is how types.LoadArgs matches them.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
}

// KeySource says where a pod's key came from.
type KeySource string

const (
	// KeyPodUID: the key is K8S_POD_UID, so node proxies see the pod's
	// real Kubernetes identity.
	KeyPodUID KeySource = "k8s-pod-uid"
	// KeyContainerID: no K8S_POD_UID (a runtime other than Kubernetes, or
	// cnitool), so the container id names the pod.
	KeyContainerID KeySource = "container-id"
)

// Identity is how the plugin names a pod to the daemon.
type Identity struct {
	// Key is the daemon's pod_uid.
	Key       string
	Source    KeySource
	Namespace string
	Name      string
}

// ParseIdentity reads CNI_ARGS. Unknown keys are an error unless the
// runtime sent IgnoreUnknown=1, as every CNI plugin does; Kubernetes
// runtimes send it.
func ParseIdentity(cniArgs, containerID string) (Identity, error) {
	var a k8sArgs
	if err := types.LoadArgs(cniArgs, &a); err != nil {
		return Identity{}, types.NewError(types.ErrInvalidEnvironmentVariables, "parse CNI_ARGS", err.Error())
	}
	id := Identity{
		Key:       string(a.K8S_POD_UID),
		Source:    KeyPodUID,
		Namespace: string(a.K8S_POD_NAMESPACE),
		Name:      string(a.K8S_POD_NAME),
	}
	if id.Key == "" {
		id.Key, id.Source = containerID, KeyContainerID
	}
	return id, nil
}
