package capturetest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// kernelEnv drives the kernel engine on real namespaces, shaping and
// tampering with them through the ip and nft binaries, as an operator or
// a pod with CAP_NET_ADMIN could.
type kernelEnv struct {
	engine *capture.Kernel
	// engines are the engine refusing foreign capture and the one taking
	// it over; SetTakeOver picks.
	engines [2]*capture.Kernel
}

// NewKernelEnv returns an Env over the kernel engine. It needs root (see
// nstest.RequirePrivileged): the test is skipped when
// NFTREDIR_SKIP_PRIVILEGED=1 and fails otherwise without root.
func NewKernelEnv(t *testing.T) Env {
	t.Helper()
	nstest.RequirePrivileged(t)
	g, err := netns.NewGuard()
	if err != nil {
		t.Fatal(err)
	}
	e := &kernelEnv{engines: [2]*capture.Kernel{
		capture.NewKernel(g, nft.NewNetlink()),
		capture.NewKernel(g, nft.NewNetlink(), capture.TakeOverForeign(true)),
	}}
	e.engine = e.engines[0]
	return e
}

func (e *kernelEnv) SetTakeOver(_ *testing.T, on bool) {
	e.engine = e.engines[0]
	if on {
		e.engine = e.engines[1]
	}
}

// AddForeignCapture installs istio-cni's in-pod rules with iptables-nft,
// for both families.
func (e *kernelEnv) AddForeignCapture(t *testing.T, path string) {
	t.Helper()
	name := filepath.Base(path)
	for _, v := range []struct {
		cmd  string
		args [2]string
	}{{"iptables-nft-restore", IstioV4}, {"ip6tables-nft-restore", IstioV6}} {
		cmd := exec.Command("ip", "netns", "exec", name, v.cmd, "--noflush")
		cmd.Stdin = strings.NewReader(IstioInpodRules(v.args[0], v.args[1]))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", v.cmd, err, out)
		}
	}
}

// AddLegacyCapture adds LegacyRule with iptables-legacy.
func (e *kernelEnv) AddLegacyCapture(t *testing.T, path string) {
	t.Helper()
	run(t, "ip", append([]string{"netns", "exec", filepath.Base(path), "iptables-legacy"}, strings.Fields(LegacyRule)...)...)
}

// AddRouting installs r with ip, as istio-cni's agent does.
func (e *kernelEnv) AddRouting(t *testing.T, path string, r netns.Routing) {
	t.Helper()
	name := filepath.Base(path)
	for _, fam := range []string{"-4", "-6"} {
		run(t, "ip", fam, "-n", name, "route", "add", "local", "default", "dev", "lo", "table", fmt.Sprint(r.Table))
		run(t, "ip", fam, "-n", name, "rule", "add", "fwmark", fmt.Sprintf("%#x/%#x", r.Mark, r.Mask), "pref", fmt.Sprint(r.Priority), "lookup", fmt.Sprint(r.Table))
	}
}

func (e *kernelEnv) Engine() capture.Engine { return e.engine }

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func addNetns(t *testing.T, name string) {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
}

// NewNamespace creates /run/netns/<unique>, deleted when the test ends
// whatever the test did to it meanwhile.
func (e *kernelEnv) NewNamespace(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := nstest.NamePrefix + "c" + hex.EncodeToString(b)
	path := filepath.Join("/run/netns", name)
	addNetns(t, name)
	t.Cleanup(func() {
		if _, err := os.Lstat(path); err != nil {
			return
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return path
}

func (e *kernelEnv) DeleteNamespace(t *testing.T, path string) {
	t.Helper()
	run(t, "ip", "netns", "del", filepath.Base(path))
}

func (e *kernelEnv) ReplaceNamespace(t *testing.T, path string) {
	t.Helper()
	e.DeleteNamespace(t, path)
	addNetns(t, filepath.Base(path))
}

func (e *kernelEnv) NotNamespace(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "not-a-namespace")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (e *kernelEnv) HostNamespace(*testing.T) string { return "/proc/self/ns/net" }

func nftIn(t *testing.T, path string, args ...string) string {
	t.Helper()
	return run(t, "ip", append([]string{"netns", "exec", filepath.Base(path), "nft"}, args...)...)
}

// firstRule returns the first rule handle of rs's first chain.
func firstRule(t *testing.T, path string, rs *nft.Ruleset) (chain, handle string) {
	t.Helper()
	chain = rs.Chains[0].Name
	for l := range strings.Lines(nftIn(t, path, "-a", "list", "chain", "inet", nft.TableName, chain)) {
		if _, h, ok := strings.Cut(strings.TrimSpace(l), " # handle "); ok && strings.Contains(l, "comment") {
			return chain, h
		}
	}
	t.Fatalf("no rule in chain %s", chain)
	return "", ""
}

func (e *kernelEnv) EditRule(t *testing.T, path string, rs *nft.Ruleset) {
	t.Helper()
	chain, h := firstRule(t, path, rs)
	nftIn(t, path, "replace", "rule", "inet", nft.TableName, chain, "handle", h,
		"meta", "l4proto", "tcp", "accept", "comment", fmt.Sprintf("%q", rs.Comment()))
}

func (e *kernelEnv) AddForeignRule(t *testing.T, path string, rs *nft.Ruleset) {
	t.Helper()
	nftIn(t, path, "add", "rule", "inet", nft.TableName, rs.Chains[0].Name, "counter")
}

func (e *kernelEnv) DeleteTable(t *testing.T, path string) {
	t.Helper()
	nftIn(t, path, "delete", "table", "inet", nft.TableName)
}

func (e *kernelEnv) DeleteRule(t *testing.T, path string, r netns.Routing, family int) {
	t.Helper()
	fam := "-4"
	if family == unix.AF_INET6 {
		fam = "-6"
	}
	run(t, "ip", "-n", filepath.Base(path), fam, "rule", "del",
		"fwmark", fmt.Sprintf("%#x/%#x", r.Mark, r.Mask), "pref", fmt.Sprint(r.Priority), "lookup", fmt.Sprint(r.Table))
}

// Dump lists the whole nftables ruleset, the legacy iptables rules,
// every rule and every route of every table, for both families.
func (e *kernelEnv) Dump(t *testing.T, path string) string {
	t.Helper()
	name := filepath.Base(path)
	var sb strings.Builder
	sb.WriteString(nftIn(t, path, "list", "ruleset"))
	// -save lists only the tables that exist (it reads
	// /proc/net/ip_tables_names), so dumping creates none. Its comment
	// lines carry the time.
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		for l := range strings.Lines(run(t, "ip", "netns", "exec", name, save)) {
			if !strings.HasPrefix(l, "#") {
				sb.WriteString(l)
			}
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		sb.WriteString(run(t, "ip", "-n", name, fam, "rule", "show"))
		sb.WriteString(run(t, "ip", "-n", name, fam, "route", "show", "table", "all"))
	}
	return sb.String()
}
