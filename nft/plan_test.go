package nft

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/internal/nftlive"
)

// liveOf is what the kernel reports for t, applied as is: every chain with
// our rules, expressions in the library's encoding.
func liveOf(t *Table) *Live {
	lt := &nftlive.Table{Name: t.Name}
	for _, c := range t.Chains {
		lc := &nftlive.Chain{Name: c.Name, Base: true, Type: c.Type, Hook: *c.Hook, Priority: c.Priority, Policy: nftables.ChainPolicyAccept}
		for i, r := range c.Rules {
			lc.Rules = append(lc.Rules, &nftlive.Rule{Handle: uint64(i + 1), Exprs: slices.Clone(r.wire), Comment: t.Comment()})
		}
		lt.Chains = append(lt.Chains, lc)
	}
	l := &Live{Table: lt, Sets: map[string]*nftables.Set{}, Elems: map[netip.Addr]string{}, setsOK: map[string]bool{}}
	for _, s := range t.Sets {
		l.Sets[s.Name] = &nftables.Set{Name: s.Name, KeyType: s.Type}
		l.setsOK[s.Name] = true
	}
	return l
}

func podTable(t *testing.T) *Table {
	t.Helper()
	rs, err := Build(DefaultSpec("0b6f3c1e-pod"))
	if err != nil {
		t.Fatal(err)
	}
	return &rs.Table
}

// TestPlanSendsOnlyWhatDiffers: the one planner both tables use creates a
// missing table whole, sends nothing for an exact one, and otherwise
// touches only what differs: a drifted chain is refilled and the others
// are left alone (their rules, handles and counters stay), a foreign chain
// is deleted, a chain of another shape recreated, flags cleared.
func TestPlanSendsOnlyWhatDiffers(t *testing.T) {
	want := podTable(t)
	last := len(want.Chains) - 1
	for _, tc := range []struct {
		name   string
		tamper func(l *Live)
		check  func(t *testing.T, b *Batch)
	}{
		{"absent", func(l *Live) { l.Table = nil }, func(t *testing.T, b *Batch) {
			if b.tableOp != tableCreate {
				t.Errorf("table op %d, want create", b.tableOp)
			}
			for _, c := range want.Chains {
				if b.chains[c.Name] != chainAdd {
					t.Errorf("chain %s op %d, want add", c.Name, b.chains[c.Name])
				}
			}
		}},
		{"in sync", func(*Live) {}, func(t *testing.T, b *Batch) {
			if !b.Empty() {
				t.Errorf("batch for an exact table is not empty: %+v", b)
			}
		}},
		{"rule edited", func(l *Live) {
			r := l.Table.Chains[last].Rules[0]
			r.Exprs = r.Exprs[:len(r.Exprs)-1]
		}, func(t *testing.T, b *Batch) {
			for i, c := range want.Chains {
				if op, wantOp := b.chains[c.Name], map[bool]chainOp{true: chainRefill, false: chainKeep}[i == last]; op != wantOp {
					t.Errorf("chain %s op %d, want %d", c.Name, op, wantOp)
				}
			}
			if b.tableOp != tableKeep || len(b.delChains) > 0 {
				t.Errorf("table op %d, deleted chains %v; want neither", b.tableOp, b.delChains)
			}
		}},
		{"foreign rule in our chain", func(l *Live) {
			l.Table.Chains[0].Rules = append(l.Table.Chains[0].Rules, &nftlive.Rule{Handle: 99})
		}, func(t *testing.T, b *Batch) {
			if b.chains[want.Chains[0].Name] != chainRefill || b.chains[want.Chains[last].Name] != chainKeep {
				t.Errorf("chain ops %v, want only %s refilled", b.chains, want.Chains[0].Name)
			}
		}},
		{"foreign chain", func(l *Live) {
			l.Table.Chains = append(l.Table.Chains, &nftlive.Chain{Name: "extra", Base: true, Type: nftables.ChainTypeFilter, Hook: *nftables.ChainHookInput})
		}, func(t *testing.T, b *Batch) {
			if !slices.Equal(b.delChains, []string{"extra"}) {
				t.Errorf("deleted chains %v, want [extra]", b.delChains)
			}
		}},
		{"policy drop", func(l *Live) { l.Table.Chains[1].Policy = nftables.ChainPolicyDrop }, func(t *testing.T, b *Batch) {
			for i, c := range want.Chains {
				if op, wantOp := b.chains[c.Name], map[bool]chainOp{true: chainRecreate, false: chainKeep}[i >= 1]; op != wantOp {
					t.Errorf("chain %s op %d, want %d", c.Name, op, wantOp)
				}
			}
		}},
		{"dormant", func(l *Live) { l.Table.Flags = unix.NFT_TABLE_F_DORMANT }, func(t *testing.T, b *Batch) {
			if b.tableOp != tableAdd {
				t.Errorf("table op %d, want add (flags 0)", b.tableOp)
			}
			for name, op := range b.chains {
				if op != chainKeep {
					t.Errorf("chain %s op %d, want kept", name, op)
				}
			}
		}},
		{"chain missing", func(l *Live) { l.Table.Chains = l.Table.Chains[1:] }, func(t *testing.T, b *Batch) {
			if b.chains[want.Chains[0].Name] != chainAdd {
				t.Errorf("chain %s op %d, want add", want.Chains[0].Name, b.chains[want.Chains[0].Name])
			}
			// An added chain is listed last: the ones after it follow it.
			for _, c := range want.Chains[1:] {
				if b.chains[c.Name] != chainRecreate {
					t.Errorf("chain %s op %d, want recreate (behind the added one)", c.Name, b.chains[c.Name])
				}
			}
		}},
		{"last chain missing", func(l *Live) { l.Table.Chains = l.Table.Chains[:last] }, func(t *testing.T, b *Batch) {
			for i, c := range want.Chains {
				if op, wantOp := b.chains[c.Name], map[bool]chainOp{true: chainAdd, false: chainKeep}[i == last]; op != wantOp {
					t.Errorf("chain %s op %d, want %d", c.Name, op, wantOp)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := liveOf(want)
			tc.tamper(l)
			b := Plan(l, want, nil)
			tc.check(t, b)
			if tc.name == "in sync" {
				if p := l.Problems(want); len(p) > 0 {
					t.Errorf("problems of an exact table: %v", p)
				}
			} else if p := l.Problems(want); len(p) == 0 {
				t.Error("Plan sends a batch but Problems finds nothing")
			}
		})
	}
}

// TestPlanReplacesWrongSetWithSeed: a set of another type is deleted and
// created again with its seed, and the chain whose rules look it up is
// refilled first, for the table with sets (the node's).
func TestPlanReplacesWrongSetWithSeed(t *testing.T) {
	want := &Table{
		Name: "sets", Family: nftables.TableFamilyINet, Label: "test",
		Sets: []Set{{Name: "v4", Type: nftables.TypeIPAddr}},
		Chains: []Chain{{Name: "post", Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPostrouting, Priority: PrioritySrcNAT,
			Rules: []Rule{NewRule(L4Proto(unix.IPPROTO_TCP, "tcp"), DaddrInSet(false, "v4"), SNAT(netip.MustParseAddr("169.254.7.127")))}}},
	}
	if err := want.Encode(); err != nil {
		t.Fatal(err)
	}
	l := liveOf(want)
	l.setsOK["v4"] = false
	l.Sets["stray"] = &nftables.Set{Name: "stray"}
	a := netip.MustParseAddr("10.0.0.1")
	b := Plan(l, want, func(set string) map[netip.Addr]string { return map[netip.Addr]string{a: "pod-" + set} })
	if !slices.Equal(b.delSets, []string{"v4", "stray"}) {
		t.Errorf("deleted sets %v, want [v4 stray]", b.delSets)
	}
	if got := b.seeds["v4"]; len(got) != 1 || got[a] != "pod-v4" {
		t.Errorf("seed of v4 %v, want %s owned by pod-v4", got, a)
	}
	if b.chains["post"] != chainRefill {
		t.Errorf("chain op %d, want refill (its rule looks the replaced set up)", b.chains["post"])
	}
	if got := want.String(); got != "table inet sets {\n\tset v4 {\n\t\ttype ipv4_addr\n\t}\n\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n"+
		"\t\tmeta l4proto tcp ip daddr @v4 counter packets 0 bytes 0 snat ip to 169.254.7.127 comment \"test digest="+want.Digest+"\"\n\t}\n}\n" {
		t.Errorf("rendering:\n%s", got)
	}
}
