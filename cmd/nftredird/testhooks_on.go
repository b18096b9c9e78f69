//go:build nftredir_testhooks

package main

import (
	"os"
	"time"
)

// nriTestDelay is NFTREDIR_TEST_NRI_DELAY: in a build for tests only
// (-tags nftredir_testhooks), every NRI RunPodSandbox waits this long
// first, so that a test can show what a hook slower than the runtime's
// request timeout does to a pod. A product build has no such variable.
func nriTestDelay() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("NFTREDIR_TEST_NRI_DELAY"))
	return d
}
