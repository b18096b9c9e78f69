package peercred

import (
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAllows(t *testing.T) {
	a := NewAllowlist([]uint32{1000}, []uint32{2000})
	for _, tc := range []struct {
		c    *Cred
		want bool
	}{
		{nil, false},
		{&Cred{UID: 0, GID: 5}, true},
		{&Cred{UID: 1000, GID: 5}, true},
		{&Cred{UID: 1001, GID: 2000}, true},
		{&Cred{UID: 1001, GID: 5, Groups: []uint32{7, 2000}}, true},
		{&Cred{UID: 1001, GID: 5, Groups: []uint32{7}}, false},
		{&Cred{UID: 1001, GID: 0}, false}, // group 0 is not root
	} {
		if got := a.Allows(tc.c); got != tc.want {
			t.Errorf("Allows(%v) = %v, want %v", tc.c, got, tc.want)
		}
	}
	if (Allowlist{}).Allows(&Cred{UID: 1000}) {
		t.Error("the zero Allowlist must allow root only")
	}
}

func TestFromFdReadsOurOwnCredentials(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	c, err := FromFd(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	if c.UID != uint32(os.Geteuid()) || c.GID != uint32(os.Getegid()) || c.PID != int32(os.Getpid()) {
		t.Errorf("FromFd = %v; want this process (uid %d gid %d pid %d)", c, os.Geteuid(), os.Getegid(), os.Getpid())
	}
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, len(groups))
	for i, g := range groups {
		want[i] = uint32(g)
	}
	got := slices.Clone(c.Groups)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("groups %v, want %v", got, want)
	}
}
