package main

import (
	"errors"
	"fmt"
	"net"

	"github.com/nftredir/nftredir/internal/sockfile"
)

// listenSocket opens the API socket: a root-owned directory nobody else
// may write, and a 0660 socket owned by root and the configured group
// (see CVE-2022-29178 for what an inherited group did to another node
// agent). The errors name the flag to change.
func listenSocket(path string, gid int) (*net.UnixListener, error) {
	lis, err := sockfile.Listen(path, "unix", gid)
	switch {
	case errors.Is(err, sockfile.ErrInUse):
		return nil, fmt.Errorf("another nftredird is serving on %s; stop it first", path)
	case err != nil:
		return nil, fmt.Errorf("%w; fix it or choose another --socket", err)
	}
	return lis, nil
}
