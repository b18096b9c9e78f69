package zds

import (
	"net"

	"github.com/nftredir/nftredir/internal/sockfile"
)

// ErrInUse: something already answers on the socket path.
var ErrInUse = sockfile.ErrInUse

// listen creates the SOCK_SEQPACKET socket at path. Whoever connects
// receives every pod's namespace, so the socket gets the same care as the
// API's: see sockfile. Members of group gid can reach it; the server then
// checks each caller against Config.Allow.
func listen(path string, gid int) (*net.UnixListener, error) {
	return sockfile.Listen(path, "unixpacket", gid)
}
