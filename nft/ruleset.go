package nft

// Ruleset is the complete content of our table for one pod: a pure value
// that Build returns and an Applier programs. Its Table is what the
// engine applies, reads back and compares; Spec is what built it.
type Ruleset struct {
	Spec Spec
	Table
}
