package state

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/nftredir/nftredir/nft"
)

// CheckPodUID is the rule every pod uid meets, in requests and records:
// the uid lands in rule comments, logs and file contents, so it is kept
// to visible characters that need no quoting anywhere.
func CheckPodUID(uid string) error {
	switch {
	case uid == "":
		return fmt.Errorf("pod_uid is required (the pod's Kubernetes UID)")
	case len(uid) > nft.MaxPodIDLen:
		return fmt.Errorf("pod_uid is %d bytes, at most %d allowed", len(uid), nft.MaxPodIDLen)
	case !utf8.ValidString(uid):
		return fmt.Errorf("pod_uid must be valid UTF-8")
	}
	for _, r := range uid {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '/' || r == '"' || r == '\\' || r == '\'' {
			return fmt.Errorf("pod_uid %q contains %q; use printable characters without spaces, slashes, quotes or backslashes", uid, r)
		}
	}
	return nil
}
