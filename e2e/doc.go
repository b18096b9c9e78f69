// Package e2e holds tests that run nftredir against real network
// namespaces and real sockets. They need root; see internal/testkit/nstest.
package e2e
