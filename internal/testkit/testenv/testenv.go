// Package testenv decides what a test does when the machine lacks
// something it needs (root, a cached tool): skip, saying how to provide
// it, so that a plain `go test ./...` on a developer's machine runs what
// it can; or, under CI (CI=true), fail, because there a skipped suite
// would look exactly like a passing one.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Missing skips t with the message, or fails it under CI.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
