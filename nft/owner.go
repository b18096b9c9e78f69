package nft

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/internal/nftlive"
	"github.com/nftredir/nftredir/netns"
)

// commentPodPrefix and commentDigestSep frame the pod id in Comment.
const (
	commentPodPrefix = "nftredir pod="
	commentDigestSep = " digest="
)

// podOfComment is the inverse of (*Ruleset).Comment: the pod id a rule
// comment names, or false if it is not one of ours.
func podOfComment(c string) (string, bool) {
	rest, ok := strings.CutPrefix(c, commentPodPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, commentDigestSep)
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// Owner says which pod our table in ns was built for, from its rule
// comments, without knowing the pod's spec: it lets a pod whose record is
// lost be released by its uid alone. exists is whether the table is
// there; pod is "" when it is absent or its rules do not agree on one pod
// (no rules, a rule without our comment, rules of two pods), so a caller
// never removes a table it cannot attribute.
func (n *Netlink) Owner(ctx context.Context, ns *netns.Handle) (pod string, exists bool, err error) {
	if err := ctx.Err(); err != nil {
		return "", false, err
	}
	var live *nftlive.Table
	err = ns.Netfilter(func(_ *nftables.Conn, r *nftlive.Conn) (err error) {
		live, err = readTable(r, nftables.TableFamilyINet, TableName)
		return err
	})
	if err != nil {
		return "", false, fmt.Errorf("owner of table %s in %s: %w", TableName, ns.Path(), err)
	}
	if live == nil {
		return "", false, nil
	}
	owner := ""
	for _, ch := range live.Chains {
		for _, r := range ch.Rules {
			pod, ok := podOfComment(r.Comment)
			if !ok || (owner != "" && pod != owner) {
				return "", true, nil
			}
			owner = pod
		}
	}
	return owner, true, nil
}
