package nft

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// vocabulary reads kernel expressions back as nft text, for rules that
// are not what we programmed: each word (Word) the builder uses, in every
// form this ruleset uses it, plus the few words someone editing a rule by
// hand is likely to leave behind. An expression no word explains is shown
// raw (nftlive.Raw), so nothing the kernel holds is hidden.
type vocabulary struct {
	words   map[string]string // canonical expressions of a word -> its text
	longest int
}

func newVocabulary(t *Table) *vocabulary {
	v := &vocabulary{words: map[string]string{}}
	add := func(p Word) {
		wire, err := nftlive.Encode(t.Family, p.exprs)
		if err != nil || len(wire) == 0 {
			return
		}
		v.words[strings.Join(nftlive.CanonicalAll(wire), "\x01")] = p.text
		v.longest = max(v.longest, len(wire))
	}
	for _, p := range []Word{
		accept(), drop(),
		L4Proto(unix.IPPROTO_TCP, "tcp"), L4Proto(unix.IPPROTO_UDP, "udp"),
		nfproto(unix.NFPROTO_IPV4, "ipv4"), nfproto(unix.NFPROTO_IPV6, "ipv6"),
	} {
		add(p)
	}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			for _, p := range r.parts {
				add(p)
			}
		}
	}
	return v
}

// render reads exprs left to right, taking the longest word that matches
// at each point.
func (v *vocabulary) render(exprs []nftlive.Expr) string {
	canon := nftlive.CanonicalAll(exprs)
	var words []string
	for i := 0; i < len(canon); {
		if packets, bytes, ok := nftlive.CounterValues(exprs[i]); ok {
			// Counters compare equal whatever they counted; show what
			// this one did.
			words = append(words, counterText(packets, bytes))
			i++
			continue
		}
		n := 0
		for k := min(v.longest, len(canon)-i); k > 0; k-- {
			if t, ok := v.words[strings.Join(canon[i:i+k], "\x01")]; ok {
				words, n = append(words, t), k
				break
			}
		}
		if n == 0 {
			words, n = append(words, nftlive.Raw(exprs[i])), 1
		}
		i += n
	}
	if len(words) == 0 {
		return "[no expressions]"
	}
	return strings.Join(words, " ")
}
