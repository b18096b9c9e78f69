package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Ruleset is the complete content of our table for one pod: a pure value
// that Build returns and an Applier programs.
type Ruleset struct {
	Spec Spec
	// Digest identifies the ruleset's content; every rule's comment carries
	// it, so a listing can be checked without decoding expressions (v0.3.0
	// of the library cannot decode tproxy or socket expressions).
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
}
