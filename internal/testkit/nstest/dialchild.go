package nstest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Rules that match a socket's owner (the node probe SNAT) need connections
// made by another uid. DialAs makes them with a dialling child: the test
// binary itself, re-executed under that uid with these variables set, whose
// TestMain hands over to RunDialChild.
const (
	dialChildAddrEnv  = "NFTREDIR_NSTEST_DIAL_ADDR"
	dialChildTokenEnv = "NFTREDIR_NSTEST_DIAL_TOKEN"
)

// RunDialChild is the child's whole life when the test binary was started
// as one: connect, speak the listener protocol (a token line out, the
// listener's name back), print the name. It reports whether it ran; a
// package that uses DialAs calls it first in TestMain:
//
//	if code, ok := nstest.RunDialChild(); ok {
//		os.Exit(code)
//	}
func RunDialChild() (code int, ok bool) {
	to := os.Getenv(dialChildAddrEnv)
	if to == "" {
		return 0, false
	}
	c, err := net.DialTimeout("tcp", to, DefaultTimeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, true
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(DefaultTimeout))
	if _, err := io.WriteString(c, os.Getenv(dialChildTokenEnv)+"\n"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, true
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, true
	}
	fmt.Print(line)
	return 0, true
}

// DialChildBinary copies the running test binary where any uid can
// execute it, for DialAs: the build directory is root's alone. The copy is
// removed when the test ends.
func DialChildBinary(t testing.TB) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "nftredir-dial-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dial")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// DialAs connects over TCP from inside the namespace as uid (and gid uid)
// and returns the record of the listener that answered. bin is the copy
// DialChildBinary made, and the test binary's TestMain must call
// RunDialChild. The child is forked from a thread inside the namespace, so
// it starts there; it never has the privileges to move.
func (n *Netns) DialAs(t testing.TB, bin string, rec *Recorder, uid uint32, to netip.AddrPort) Record {
	t.Helper()
	token := newToken()
	out := n.dialAs(t, bin, uid, to, token)
	r, ok := rec.Lookup(token)
	if !ok || r.Listener != strings.TrimSpace(string(out)) {
		t.Fatalf("dial %s as uid %d: reply %q has no matching record (%v)", to, uid, out, r)
	}
	return r
}

// DialAsLine is DialAs to a server that is not the stand-in proxy (an
// app answering directly): it returns the first line of the reply.
func (n *Netns) DialAsLine(t testing.TB, bin string, uid uint32, to netip.AddrPort) string {
	t.Helper()
	return strings.TrimSpace(string(n.dialAs(t, bin, uid, to, newToken())))
}

func (n *Netns) dialAs(t testing.TB, bin string, uid uint32, to netip.AddrPort, token string) []byte {
	t.Helper()
	var out []byte
	err := n.Do(func() error {
		cmd := exec.Command(bin)
		cmd.Env = []string{dialChildAddrEnv + "=" + to.String(), dialChildTokenEnv + "=" + token}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			return fmt.Errorf("%w: %s", err, stderr.String())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dial %s as uid %d from %s: %v", to, uid, n.Name, err)
	}
	return out
}
