package nftlive

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
)

// Digest hashes what a table sends the kernel (its chains, sets and every
// rule's encoded expressions), so that any change of a builder that
// changes a rule changes the digest, with no version number to bump.
// Every field is length-prefixed, so no two sequences of fields hash
// alike.
type Digest struct{ h hash.Hash }

// NewDigest starts an empty digest.
func NewDigest() *Digest { return &Digest{h: sha256.New()} }

// Field adds one field.
func (d *Digest) Field(b []byte) {
	d.h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
	d.h.Write(b)
}

// Rule adds one rule's encoded expressions.
func (d *Digest) Rule(wire []Expr) {
	d.Field([]byte("rule"))
	for _, e := range wire {
		d.Field([]byte(e.Name))
		d.Field(e.Data)
	}
}

// String is the digest as rule comments carry it: 16 hex digits.
func (d *Digest) String() string { return hex.EncodeToString(d.h.Sum(nil)[:8]) }
