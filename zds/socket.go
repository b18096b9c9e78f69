package zds

import (
	"net"

	"github.com/nftredir/nftredir/internal/sockfile"
)

// ErrInUse: something already answers on the socket path.
var ErrInUse = sockfile.ErrInUse

// listen creates the SOCK_SEQPACKET socket at path. Whoever connects
// receives every pod's namespace, so the socket gets the same care as the
// API's: see sockfile.
func listen(path string) (*net.UnixListener, error) {
	return sockfile.Listen(path, "unixpacket", 0)
}
