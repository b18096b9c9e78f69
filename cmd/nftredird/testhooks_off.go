//go:build !nftredir_testhooks

package main

import "time"

// nriTestDelay is zero outside builds for tests (testhooks_on.go).
func nriTestDelay() time.Duration { return 0 }
