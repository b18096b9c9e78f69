package netns

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// soNetnsCookie is SO_NETNS_COOKIE (Linux 5.14), absent from x/sys.
const soNetnsCookie = 71

// cookieOf reads the namespace's cookie through a socket created inside
// it. Kernels without SO_NETNS_COOKIE give 0: identity then rests on
// dev:ino alone.
func cookieOf(nsFd int) (uint64, error) {
	var cookie uint64
	err := onSacrificialThread(func() error {
		s, err := nl.GetNetlinkSocketAt(vnetns.NsHandle(nsFd), vnetns.None(), unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer s.Close()
		v, err := unix.GetsockoptUint64(s.GetFd(), unix.SOL_SOCKET, soNetnsCookie)
		if errors.Is(err, unix.ENOPROTOOPT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("SO_NETNS_COOKIE: %w", err)
		}
		cookie = v
		return nil
	})
	return cookie, err
}
