package nftlive

import (
	"encoding/hex"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The kernel forms below were dumped by Linux 6.18 for rules the library
// (v0.3.0) programmed from the same expressions; each is one of the
// differences Canonical documents.
func TestCanonicalMatchesKernelDump(t *testing.T) {
	for _, tc := range []struct {
		name   string
		x      expr.Any
		kernel string // NFTA_EXPR_DATA as dumped
	}{
		{"nests lose NLA_F_NESTED; bitwise op added",
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0xff, 0x0f, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			"08000100000000010800020000000001080003000000000408000600000000000c00040008000100ff0f00000c0005000800010000000000"},
		{"attributes in the kernel's order",
			&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true},
			"08000400000000010800020000000011"},
		{"socket level dropped",
			&expr.Socket{Key: expr.SocketKeyTransparent, Register: 1},
			"08000100000000000800020000000001"},
		{"redir maximum register filled in",
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
			"080001000000000108000200000000010800030000000002"},
		{"lookup without set id, with flags",
			&expr.Lookup{SourceRegister: 1, SetName: "pod-ips-v4"},
			"0f000100706f642d6970732d7634000008000200000000010800050000000000"},
		{"nat maps addresses",
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1},
			"08000100000000000800020000000002080003000000000108000400000000010800070000000001"},
		{"verdict nests",
			&expr.Verdict{Kind: expr.VerdictAccept},
			"0800010000000000100002000c0002000800010000000001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := Encode(nftables.TableFamilyINet, []expr.Any{tc.x})
			if err != nil {
				t.Fatal(err)
			}
			kernel := Expr{Name: enc[0].Name, Data: unhex(t, tc.kernel)}
			if string(enc[0].Data) == string(kernel.Data) {
				t.Fatalf("library and kernel forms are identical; the case tests nothing")
			}
			if Canonical(enc[0]) != Canonical(kernel) {
				t.Errorf("Canonical differs:\nlibrary %x\nkernel  %x", enc[0].Data, kernel.Data)
			}
		})
	}
}

// Normalising must not make different expressions equal.
func TestCanonicalKeepsDifferences(t *testing.T) {
	for _, tc := range []struct {
		name   string
		x      expr.Any
		kernel string
	}{
		{"bitwise shift is not mask-and-xor",
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0xff, 0x0f, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			"08000100000000010800020000000001080003000000000408000600000000010c00040008000100ff0f00000c0005000800010000000000"},
		{"another mask",
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0xff, 0x0f, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			"08000100000000010800020000000001080003000000000408000600000000000c00040008000100ff0f0f000c0005000800010000000000"},
		{"socket wildcard is not transparent",
			&expr.Socket{Key: expr.SocketKeyTransparent, Register: 1},
			"08000100000000020800020000000001"},
		{"socket cgroupv2 keeps its level",
			&expr.Socket{Key: expr.SocketKeyCgroupv2, Register: 1, Level: 1},
			"08000100000000030800020000000001"},
		{"redir range to another register",
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
			"080001000000000108000200000000020800030000000002"},
		{"inverted lookup",
			&expr.Lookup{SourceRegister: 1, SetName: "pod-ips-v4"},
			"0f000100706f642d6970732d7634000008000200000000010800050000000001"},
		{"lookup of another set",
			&expr.Lookup{SourceRegister: 1, SetName: "pod-ips-v4"},
			"0f000100706f642d6970732d7636000008000200000000010800050000000000"},
		{"nat with random port",
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1},
			"08000100000000000800020000000002080003000000000108000400000000010800070000000005"},
		{"drop is not accept",
			&expr.Verdict{Kind: expr.VerdictAccept},
			"0800010000000000100002000c0002000800010000000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := Encode(nftables.TableFamilyINet, []expr.Any{tc.x})
			if err != nil {
				t.Fatal(err)
			}
			if got := (Expr{Name: enc[0].Name, Data: unhex(t, tc.kernel)}); Canonical(enc[0]) == Canonical(got) {
				t.Errorf("Canonical makes %x equal to %x", enc[0].Data, got.Data)
			}
		})
	}
}

func TestRawShowsNameAndAttributes(t *testing.T) {
	got := Raw(Expr{Name: "counter", Data: unhex(t, "0c00010000000000000000050c000200000000000000002a")})
	if want := "[expr counter 1=0000000000000005 2=000000000000002a]"; got != want {
		t.Errorf("Raw = %q, want %q", got, want)
	}
}
