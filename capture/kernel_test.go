package capture_test

import (
	"testing"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestContractKernel holds the kernel engine to the contract the Fake is
// held to; it needs root.
func TestContractKernel(t *testing.T) {
	nstest.RequirePrivileged(t)
	capturetest.Run(t, capturetest.NewKernelEnv)
}
