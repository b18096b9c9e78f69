package netns

import (
	"runtime"

	vnetns "github.com/vishvananda/netns"
)

// onSacrificialThread runs fn on a fresh goroutine locked to its OS thread.
// The netlink libraries create sockets inside a namespace by switching the
// calling thread in and back, ignoring a failure to switch back. Running
// them here confines that switch to a thread nothing else uses, and if the
// thread is not back in the process's namespace afterwards it stays locked,
// so the runtime destroys it when the goroutine ends instead of reusing it.
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
