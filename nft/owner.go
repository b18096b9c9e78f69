package nft

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

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
	c, err := conn(ns, true)
	if err != nil {
		return "", false, err
	}
	defer c.CloseLasting()
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("owner of table %s in %s: %w", TableName, ns.Path(), err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", true, fmt.Errorf("owner of table %s in %s: list chains: %w", TableName, ns.Path(), err)
	}
	owner := ""
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		rules, err := c.GetRules(table(), ch)
		if err != nil {
			return "", true, fmt.Errorf("owner of table %s in %s: list rules of %s: %w", TableName, ns.Path(), ch.Name, err)
		}
		for _, r := range rules {
			comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			pod, ok := podOfComment(comment)
			if !ok || (owner != "" && pod != owner) {
				return "", true, nil
			}
			owner = pod
		}
	}
	return owner, true, nil
}
