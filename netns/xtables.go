package netns

import (
	"bufio"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XTable is a legacy (xtables) iptables table that holds rules. Such rules
// are not nftables objects: netlink can neither read nor remove them, so
// a namespace with any cannot be taken over safely.
type XTable struct {
	// Family is "ip" (iptables) or "ip6" (ip6tables).
	Family string
	// Name is the table: nat, mangle, raw, filter or security.
	Name string
	// Entries counts what the table holds beyond its empty built-in
	// chains: each rule is one entry, each user chain two.
	Entries int
}

func (x XTable) String() string {
	cmd := "iptables"
	if x.Family == "ip6" {
		cmd = "ip6tables"
	}
	return fmt.Sprintf("%s table %s (%d entries beyond its built-in chains)", cmd, x.Name, x.Entries)
}

// LegacyTables lists the namespace's legacy iptables tables that hold
// rules or chains of their own, as they were when the handle entered the
// namespace (its first use, or the visit that remade its sockets after a
// failed batch). A table the kernel merely instantiated (a listing does
// that) and left with its built-in chains empty captures nothing and is
// not listed.
//
// They are read during that visit because nothing else can read them:
// the table names come only from /proc/net/{ip,ip6}_tables_names, which
// shows the namespace of the reading thread (/proc/thread-self: /proc/self
// is the thread-group leader's), and asking the kernel about a table that
// does not exist (IPT_SO_GET_INFO) makes it instantiate one. Reading them
// in the one visit keeps a namespace entered once per handle.
func LegacyTables(h *Handle) ([]XTable, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil, errClosed
	}
	if !h.c.visited {
		if err := h.visit(nil); err != nil {
			return nil, err
		}
	}
	if h.c.legacyErr != nil {
		return nil, fmt.Errorf("legacy iptables tables of %s: %w", h.path, h.c.legacyErr)
	}
	return append([]XTable(nil), h.c.legacy...), nil
}

// Options of linux/netfilter_ipv4/ip_tables.h and ipv6/ip6_tables.h.
const (
	iptSOGetInfo  = 64 // IPT_SO_GET_INFO
	ip6tSOGetInfo = 64 // IP6T_SO_GET_INFO
)

// xtGetinfo is struct ipt_getinfo (and ip6t_getinfo, the same layout).
type xtGetinfo struct {
	Name       [32]byte
	ValidHooks uint32
	HookEntry  [5]uint32
	Underflow  [5]uint32
	NumEntries uint32
	Size       uint32
}

// legacyHere runs on a thread inside the namespace.
func legacyHere() ([]XTable, error) {
	var out []XTable
	for _, fam := range []struct {
		name, proc    string
		domain, level int
		opt           int
	}{
		{"ip", "ip_tables_names", unix.AF_INET, unix.SOL_IP, iptSOGetInfo},
		{"ip6", "ip6_tables_names", unix.AF_INET6, unix.SOL_IPV6, ip6tSOGetInfo},
	} {
		names, err := readNames("/proc/thread-self/net/" + fam.proc)
		if err != nil {
			return nil, err
		}
		if len(names) == 0 {
			continue
		}
		// Any socket of the family reaches the xtables getsockopt: IP's
		// hands options it does not know to netfilter. iptables opens a
		// raw one, which needs CAP_NET_RAW; a datagram socket needs no
		// capability, and the query itself CAP_NET_ADMIN, the only two
		// the chart's container has with SYS_ADMIN.
		s, err := unix.Socket(fam.domain, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("socket for %s tables: %w", fam.name, err)
		}
		for _, name := range names {
			var info xtGetinfo
			copy(info.Name[:len(info.Name)-1], name)
			size := uint32(unsafe.Sizeof(info))
			_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s), uintptr(fam.level), uintptr(fam.opt),
				uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
			if errno == unix.ENOENT {
				continue // gone since the listing
			}
			if errno != 0 {
				unix.Close(s)
				return nil, fmt.Errorf("%s table %s: get info: %w", fam.name, name, errno)
			}
			// An empty table is one entry per built-in chain (its policy)
			// and the closing error entry.
			builtin := bits.OnesCount32(info.ValidHooks) + 1
			if extra := int(info.NumEntries) - builtin; extra > 0 {
				out = append(out, XTable{Family: fam.name, Name: name, Entries: extra})
			}
		}
		unix.Close(s)
	}
	return out, nil
}

// readNames reads one of /proc/net/*_tables_names; a kernel without the
// module has no file, which means no tables.
func readNames(path string) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); n != "" {
			names = append(names, n)
		}
	}
	return names, sc.Err()
}
