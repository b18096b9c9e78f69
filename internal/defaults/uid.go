package defaults

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxPodUIDLen keeps the pod UID, which tags every rule of the pod's table
// and every element of the node probe sets, within the kernel's 256-byte
// userdata. A Kubernetes UID is 36 bytes; a CNI container id is 64.
const MaxPodUIDLen = 128

// CheckPodUID is the rule every pod UID follows, wherever it comes from
// (an API request, a record, the ruleset builder): non-empty, at most
// MaxPodUIDLen bytes of UTF-8, and only printable characters without
// spaces, slashes, quotes or backslashes, because the UID lands in rule
// comments, logs and file names, and must need no quoting in any of them.
//
// The error completes a sentence whose subject the caller names ("pod_uid
// is required ..." in the API, "pod id ..." in the builder).
func CheckPodUID(uid string) error {
	switch {
	case uid == "":
		return errors.New("is required (the pod's Kubernetes UID)")
	case len(uid) > MaxPodUIDLen:
		return fmt.Errorf("is %d bytes, at most %d allowed", len(uid), MaxPodUIDLen)
	case !utf8.ValidString(uid):
		return errors.New("must be valid UTF-8")
	}
	for _, r := range uid {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '/' || r == '"' || r == '\\' || r == '\'' {
			return fmt.Errorf("%q contains %q; use printable characters without spaces, slashes, quotes or backslashes", uid, r)
		}
	}
	return nil
}
