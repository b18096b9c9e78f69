package capturetest

import (
	"strings"

	"github.com/google/nftables"

	"github.com/nftredir/nftredir/nft"
)

// IstioInpodRules is istio-cni's in-pod ruleset (iptables backend, the
// default REDIRECT mode with DNS capture) as it feeds it to
// `iptables-restore --noflush` (istio/istio cni/pkg/iptables/testdata/
// default.golden; research/istio.md 1.2), for the family of loopback and
// probe source: "127.0.0.1/32" and "169.254.7.127" for iptables,
// "::1/128" and the IPv6 probe address for ip6tables. Its ports are
// Istio's (15001, 15006, 15008, 15053).
func IstioInpodRules(loopback, probe string) string {
	return strings.NewReplacer("LOOPBACK", loopback, "PROBE", probe).Replace(istioInpod)
}

const istioInpod = `*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s PROBE -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d PROBE -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d LOOPBACK -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d LOOPBACK -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d LOOPBACK -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d LOOPBACK -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
*raw
-N ISTIO_OUTPUT
-N ISTIO_PRERT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
`

// IstioV4 and IstioV6 are the arguments of IstioInpodRules for each
// family, with Istio's default probe addresses.
var (
	IstioV4 = [2]string{"127.0.0.1/32", "169.254.7.127"}
	IstioV6 = [2]string{"::1/128", "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"}
)

// IstioForeign is what FindForeign reports for IstioInpodRules installed
// for IPv4 alone (v6 false) or for both families.
func IstioForeign(v6 bool) *nft.Foreign {
	f := &nft.Foreign{}
	fams := []nftables.TableFamily{nftables.TableFamilyIPv4}
	if v6 {
		fams = append(fams, nftables.TableFamilyIPv6)
	}
	for _, fam := range fams {
		for _, table := range []string{"mangle", "nat", "raw"} {
			for _, ch := range []string{"ISTIO_OUTPUT", "ISTIO_PRERT"} {
				f.Chains = append(f.Chains, nft.ForeignChain{Family: fam, Table: table, Name: ch})
			}
		}
	}
	return f
}

// LegacyRule is a legacy iptables rule that captures like istio-cni's
// outbound rule, as a node whose iptables is the legacy variant has it.
const LegacyRule = "-t nat -A OUTPUT -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"
