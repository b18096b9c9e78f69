package clienttest

import (
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/nft"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
	"github.com/nftredir/nftredir/server"
)

// validateAdd checks req with the daemon's own validation and returns the
// pod record the daemon would keep, refusals carrying the daemon's codes
// and messages. Timestamps and the namespace id are left to the caller.
func validateAdd(req *nftredirv1.AddPodRequest) (*nftredirv1.Pod, error) {
	p, err := lifecycle.ValidateAddPod(req, nft.DefaultSpec(""))
	return p, server.Status(err)
}

// validateUID checks the pod_uid of RemovePod and GetPod as the daemon does.
func validateUID(uid string) error { return server.Status(lifecycle.ValidatePodUID(uid)) }

// validateRemove checks a RemovePod request as the daemon does.
func validateRemove(req *nftredirv1.RemovePodRequest) error {
	return server.Status(lifecycle.ValidateRemovePod(req))
}
