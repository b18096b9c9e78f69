package nft

import "testing"

func TestOwnerParsesTheRuleComment(t *testing.T) {
	for _, uid := range []string{"pod-1", "a-digest=b", "pod=x", "x=y"} {
		rs, err := Build(DefaultSpec(uid))
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := podOfComment(rs.Comment()); !ok || got != uid {
			t.Errorf("pod of %q = %q, %v; want %q", rs.Comment(), got, ok, uid)
		}
	}
	// A space would make the comment ambiguous; the pod-UID rule refuses
	// it before any comment is built.
	if _, err := Build(DefaultSpec("a digest=b")); err == nil {
		t.Error(`Build accepted pod id "a digest=b"`)
	}
	for _, c := range []string{"", "nftredir pod=", "nftredir pod= digest=x", "someone else's", "nftredir pod=p"} {
		if got, ok := podOfComment(c); ok {
			t.Errorf("pod of %q = %q; want none", c, got)
		}
	}
}
