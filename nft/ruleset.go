package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// Ruleset is the complete content of our table for one pod: a pure value
// that Build returns and an Applier programs.
type Ruleset struct {
	Spec Spec
	// Digest identifies the ruleset's content: a hash of the pod id, the
	// chains and every rule's encoded expressions, so any change to what
	// the builder emits changes it. Every rule's comment carries it.
	Digest string
	Chains []Chain
}

// Chain is one chain of the table, base chains only (we never jump).
type Chain struct {
	Name     string
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority int32
	Rules    []Rule
}

// Rule is one rule: the expressions sent to the kernel and the same rule in
// nft syntax, as `nft list table` prints it (without the comment).
type Rule struct {
	Exprs []expr.Any
	Text  string

	// parts are the words the rule was built from, for reading a drifted
	// kernel rule back in the same vocabulary.
	parts []part
	// wire is Exprs as the library encodes them; canon is each in the
	// form Verify compares with the kernel's (Build fills both).
	wire  []nftlive.Expr
	canon []string
}
