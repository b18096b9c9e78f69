package selftest

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// TestMainThreadStays runs the self-test repeatedly while the main thread
// is idle, so the Go scheduler hands it goroutines, the scratch one among
// them: the main thread's namespace is /proc/self/ns/net, the guard's
// "own namespace", and must never move.
func TestMainThreadStays(t *testing.T) {
	nstest.RequirePrivileged(t)
	var before unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &before); err != nil {
		t.Fatal(err)
	}
	checks, err := Checks(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := Run(context.Background(), checks[:1]); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		var after unix.Stat_t
		if err := unix.Stat("/proc/self/ns/net", &after); err != nil {
			t.Fatal(err)
		}
		if before.Ino != after.Ino || before.Dev != after.Dev {
			t.Fatalf("run %d: the main thread moved to namespace %d:%d from %d:%d", i, after.Dev, after.Ino, before.Dev, before.Ino)
		}
	}
}
