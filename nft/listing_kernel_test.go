package nft_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/nft"
)

// nftJSON is the part of `nft -j list ruleset` the listing test reads.
type nftJSON struct {
	Nftables []map[string]json.RawMessage `json:"nftables"`
}

// suspect is what nft prints where it cannot make sense of what the
// kernel holds: an expression it does not know, a value it cannot
// decode, an error.
var suspect = regexp.MustCompile(`(?i)unknown|invalid|error|\[[a-z]+ [^\]]*\]|__`)

// TestDistroNftListsOurTable: after Apply, in every variant the goldens
// cover, the distribution's own nft (whatever version the node has; nft
// older than the library's encoder crashed listing newer rules,
// istio#58492) lists the whole ruleset as text and as JSON with exit 0,
// nothing on stderr, our table in it and nothing it could not decode.
func TestDistroNftListsOurTable(t *testing.T) {
	requireRoot(t)
	version, err := exec.Command("nft", "--version").Output()
	if err != nil {
		t.Fatalf("nft --version: %v", err)
	}
	t.Logf("listing with %s", strings.TrimSpace(string(version)))
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			n, h := scratchNetns(t)
			rs, err := nft.Build(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := nft.NewNetlink().Apply(context.Background(), h, rs); err != nil {
				t.Fatal(err)
			}
			var rules int
			for _, c := range rs.Chains {
				rules += len(c.Rules)
			}
			for _, args := range [][]string{{"list", "ruleset"}, {"-j", "list", "ruleset"}} {
				cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, "nft"}, args...)...)
				var stderr strings.Builder
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil || stderr.Len() > 0 {
					t.Fatalf("nft %s: %v, stderr %q", strings.Join(args, " "), err, stderr.String())
				}
				if args[0] == "-j" {
					checkJSON(t, out, rules)
					continue
				}
				if !strings.Contains(string(out), "table inet "+nft.TableName+" {") || strings.Count(string(out), rs.Comment()) != rules {
					t.Errorf("nft list ruleset does not show our table with its %d rules:\n%s", rules, out)
				}
				if m := suspect.FindString(string(out)); m != "" {
					t.Errorf("nft list ruleset shows %q:\n%s", m, out)
				}
			}
		})
	}
}

// checkJSON requires the JSON listing to parse and to hold our table and
// want rules of it, each with statements nft decoded (no "xt", no
// unknown expression).
func checkJSON(t *testing.T, out []byte, want int) {
	t.Helper()
	var doc nftJSON
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j list ruleset: %v\n%s", err, out)
	}
	var tables, rules int
	for _, obj := range doc.Nftables {
		if raw, ok := obj["table"]; ok {
			var tb struct{ Family, Name string }
			if err := json.Unmarshal(raw, &tb); err != nil {
				t.Fatalf("table %s: %v", raw, err)
			}
			if tb.Family == "inet" && tb.Name == nft.TableName {
				tables++
			}
		}
		raw, ok := obj["rule"]
		if !ok {
			continue
		}
		var r struct {
			Table string            `json:"table"`
			Expr  []json.RawMessage `json:"expr"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("rule %s: %v", raw, err)
		}
		if r.Table != nft.TableName {
			continue
		}
		rules++
		if len(r.Expr) == 0 {
			t.Errorf("nft -j shows a rule of ours without statements: %s", raw)
		}
		for _, e := range r.Expr {
			if m := suspect.FindString(string(e)); m != "" || strings.HasPrefix(string(e), `{"xt"`) {
				t.Errorf("nft -j shows %s in %s", e, raw)
			}
		}
	}
	if tables != 1 || rules != want {
		t.Errorf("nft -j list ruleset: %d tables named %s with %d rules; want 1 with %d\n%s", tables, nft.TableName, rules, want, out)
	}
}
