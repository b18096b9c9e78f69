package netns

import (
	"runtime"

	vnetns "github.com/vishvananda/netns"
)

// onSacrificialThread runs fn on a fresh goroutine locked to its OS thread,
// for work that switches the thread into another namespace and back (a
// socket belongs to the namespace of the thread that creates it). Nothing
// else runs on that thread meanwhile, and if it is not back in the
// process's namespace afterwards it stays locked, so the runtime destroys
// it when the goroutine ends instead of reusing it.
func onSacrificialThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := fn()
		if backHome() {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// backHome reports whether the current thread is in the process's own
// network namespace (that of its main thread).
func backHome() bool {
	cur, err := vnetns.Get()
	if err != nil {
		return false
	}
	defer cur.Close()
	home, err := vnetns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		return false
	}
	defer home.Close()
	return cur.Equal(home)
}
