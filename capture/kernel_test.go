package capture_test

import (
	"testing"

	"github.com/nftredir/nftredir/capture/capturetest"
)

// TestContractKernel holds the kernel engine to the contract the Fake is
// held to; it needs root.
func TestContractKernel(t *testing.T) { capturetest.Run(t, capturetest.NewKernelEnv) }
