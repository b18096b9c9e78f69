package nft_test

import (
	"context"
	"testing"

	"github.com/nftredir/nftredir/nft"
)

// A table that appears between Apply's look and its batch makes the
// exclusive create fail; Apply then replaces the whole table, on fresh
// sockets, and the pod ends in sync.
func TestApplyRetriesAsReplaceWhenTheTableChanged(t *testing.T) {
	requireRoot(t)
	n, h := scratchNetns(t)
	rs, err := nft.Build(nft.DefaultSpec("pod-retry"))
	if err != nil {
		t.Fatal(err)
	}
	raced := false
	nft.SetBeforeBatch(func() {
		if !raced {
			raced = true
			n.Nft(t, "add", "table", "inet", nft.TableName)
			n.Nft(t, "add", "chain", "inet", nft.TableName, "stray")
		}
	})
	t.Cleanup(func() { nft.SetBeforeBatch(nil) })
	if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
		t.Fatalf("Apply with a table created meanwhile: %v", err)
	}
	if !raced {
		t.Fatal("the hook did not run")
	}
	st, text, err := nft.NewNetlink().Verify(context.Background(), h, rs)
	if err != nil || st != nft.StatusInSync {
		t.Errorf("Verify = %v, %v; want in sync\n%s", st, err, text)
	}
}
