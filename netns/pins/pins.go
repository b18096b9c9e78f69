// Package pins finds a running pod's network namespace among the pins
// its container runtime made, and proves it is the pod's by the pod's
// own IPs, for pods whose sandbox the daemon never saw (started before
// it, or before the CNI plugin was chained).
//
// The candidates are the runtime's pins only (containerd and CRI-O bind
// mount each sandbox's namespace at /var/run/netns/cni-<id>, Docker at
// /var/run/docker/netns/<id>), not /proc: a /proc scan also meets every
// namespace a privileged process has entered, and istio#61211 paired a
// pod with one such. A pin is made by the runtime, for one sandbox. Each
// is opened through the netns guard (no symlink followed, nsfs checked,
// the node's namespace refused, bounded time), and a pod owns a
// namespace only if one of its API IPs is assigned to a non-loopback
// interface there and no other pinned namespace carries any of them:
// two candidates are a refusal, never a guess.
package pins

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
)

// Errors Find returns, told apart with errors.Is.
var (
	// ErrNoPodIP: the pod has no IP yet, so there is nothing to prove
	// a namespace by. It gets one once its sandbox's network is up.
	ErrNoPodIP = errors.New("the pod has no IP in the Kubernetes API")
	// ErrNotFound: no pinned namespace carries any of the pod's IPs.
	ErrNotFound = errors.New("no pinned network namespace carries the pod's IPs")
	// ErrAmbiguous: more than one namespace carries the pod's IPs.
	ErrAmbiguous = errors.New("more than one network namespace carries the pod's IPs")
	// ErrIncomplete: a pin could not be read, so a namespace it names may
	// carry the pod's IPs too, and the one found is not proven the only
	// one (nor, with none found, is the pod's namespace proven absent).
	ErrIncomplete = errors.New("some pinned network namespaces could not be read")
)

// DefaultMaxPins bounds the pins one scan opens: a node runs at most a
// few hundred pods (kubelet's maxPods is 110 by default), so thousands
// of pins mean something else is filling the directory.
const DefaultMaxPins = 4096

// Config configures New.
type Config struct {
	// Guard opens the pins; it refuses the node's namespace and the
	// daemon's own. Required.
	Guard *netns.Guard
	// Dirs are the directories holding the runtime's pins. Missing ones
	// are skipped: Docker's is there only with Docker.
	Dirs []string
	// MaxPins bounds the pins one scan opens. Zero: DefaultMaxPins.
	MaxPins int
	// Logger logs skipped pins at debug.
	Logger hclog.Logger
}

// Pin is one pinned namespace and the addresses it carries.
type Pin struct {
	// Path is the pin; Aliases are other pins of the same namespace.
	Path    string
	Aliases []string
	// ID is the namespace's identity, cookie included, as read from the
	// opened pin.
	ID netns.ID
	// Addrs are the global addresses on its non-loopback interfaces.
	Addrs []netip.Addr
}

// Scan is what one pass over the pin directories found.
type Scan struct {
	// Started is when the pass began; Took how long it ran.
	Started time.Time
	Took    time.Duration
	// Pins are the namespaces opened, one per namespace, sorted by path.
	Pins []Pin
	// Skipped says why each other entry was not a candidate: not a
	// namespace (a link, a pin whose namespace is gone), the node's, or
	// one that could not be read.
	Skipped map[string]string
	// Unreadable are the skipped entries that may still be pins of a
	// namespace (one that could not be opened in time or at all, or
	// whose interfaces could not be listed), with why: while there is
	// any, Find proves nothing.
	Unreadable map[string]string
	// Dirs are the directories scanned.
	Dirs []string
}

// Scanner scans the pin directories; it is safe for concurrent use.
type Scanner struct {
	guard *netns.Guard
	dirs  []string
	max   int
	log   hclog.Logger

	mu sync.Mutex
	// protects the following field: the latest scan, reused by Recent;
	// holding mu through a scan makes concurrent callers share it
	last *Scan
}

// New builds a Scanner.
func New(cfg Config) (*Scanner, error) {
	if cfg.Guard == nil {
		return nil, errors.New("pins: a namespace guard is required")
	}
	for _, d := range cfg.Dirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("pins: directory %q is not absolute", d)
		}
	}
	s := &Scanner{guard: cfg.Guard, dirs: slices.Clone(cfg.Dirs), max: cfg.MaxPins, log: cfg.Logger}
	if s.max <= 0 {
		s.max = DefaultMaxPins
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	return s, nil
}

// Dirs are the directories the scanner looks in.
func (s *Scanner) Dirs() []string { return slices.Clone(s.dirs) }

// Recent returns a scan that started at most maxAge ago, making one if
// the latest is older. Callers arriving during a scan wait for it and
// share it: a namespace label selecting a hundred running pods costs one
// scan, not a hundred.
func (s *Scanner) Recent(ctx context.Context, maxAge time.Duration) (*Scan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && time.Since(s.last.Started) <= maxAge {
		return s.last, nil
	}
	sc, err := s.scan(ctx)
	if err != nil {
		return nil, err
	}
	s.last = sc
	return sc, nil
}

// Scan opens every pin and lists its addresses, now.
func (s *Scanner) Scan(ctx context.Context) (*Scan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, err := s.scan(ctx)
	if err == nil {
		s.last = sc
	}
	return sc, err
}

func (s *Scanner) scan(ctx context.Context) (*Scan, error) {
	sc := &Scan{Started: time.Now(), Skipped: map[string]string{}, Unreadable: map[string]string{}, Dirs: slices.Clone(s.dirs)}
	var paths []string
	for _, dir := range s.dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read pin directory %s: %w", dir, err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			// The runtime pins a namespace on an empty regular file it
			// creates; the mount does not change the directory entry.
			if !e.Type().IsRegular() {
				sc.Skipped[p] = "not a regular file (" + e.Type().String() + ")"
				continue
			}
			paths = append(paths, p)
		}
	}
	if len(paths) > s.max {
		return nil, fmt.Errorf("%d entries in the pin directories %s, more than the %d a scan opens", len(paths), strings.Join(s.dirs, ", "), s.max)
	}
	slices.Sort(paths)
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("scan pins: %w", err)
		}
		pin, err := s.inspect(p)
		if err != nil {
			sc.Skipped[p] = err.Error()
			if !notAPin(err) {
				sc.Unreadable[p] = err.Error()
				s.log.Warn("pin cannot be read; no pod is proven by this scan", "pin", p, "why", err)
				continue
			}
			s.log.Debug("pin skipped", "pin", p, "why", err)
			continue
		}
		if i := slices.IndexFunc(sc.Pins, func(o Pin) bool { return o.ID == pin.ID }); i >= 0 {
			sc.Pins[i].Aliases = append(sc.Pins[i].Aliases, p)
			continue
		}
		sc.Pins = append(sc.Pins, pin)
	}
	sc.Took = time.Since(sc.Started)
	return sc, nil
}

// notAPin reports whether an entry's error from inspect proves that it
// pins no pod's namespace: gone since the listing, not a namespace (a pin
// whose namespace is gone is an empty file again), or the node's.
// Anything else (a timeout, a refused access, interfaces that could not
// be listed) leaves the entry unknown.
func notAPin(err error) bool {
	return errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetns) || errors.Is(err, netns.ErrHostNetns)
}

// inspect opens one pin and reads its identity and addresses.
func (s *Scanner) inspect(path string) (Pin, error) {
	h, err := s.guard.OpenPin(path)
	if err != nil {
		return Pin{}, err
	}
	defer h.Close()
	addrs, err := netns.InterfaceAddrs(h)
	if err != nil {
		return Pin{}, err
	}
	return Pin{Path: path, ID: h.ID(), Addrs: addrs}, nil
}

// Find proves which pinned namespace is the pod's with the IPs ips (the
// pod's status.podIPs): the one namespace carrying any of them, while
// every pin could be read. No namespace, more than one, or a pin that
// could not be read is an error naming why.
func (sc *Scan) Find(ips []netip.Addr) (Pin, error) {
	if len(ips) == 0 {
		return Pin{}, ErrNoPodIP
	}
	var found []Pin
	for _, pin := range sc.Pins {
		if slices.ContainsFunc(pin.Addrs, func(a netip.Addr) bool { return slices.Contains(ips, a) }) {
			found = append(found, pin)
		}
	}
	if len(found) < 2 && len(sc.Unreadable) > 0 {
		var why []string
		for _, p := range slices.Sorted(maps.Keys(sc.Unreadable)) {
			why = append(why, p+": "+sc.Unreadable[p])
		}
		return Pin{}, fmt.Errorf("%w: %s found in %d of %d readable namespaces, but %s", ErrIncomplete, addrList(ips), len(found), len(sc.Pins), strings.Join(why, "; "))
	}
	switch len(found) {
	case 0:
		return Pin{}, fmt.Errorf("%w: %s in none of %d namespaces pinned under %s", ErrNotFound, addrList(ips), len(sc.Pins), strings.Join(sc.Dirs, ", "))
	case 1:
		return found[0], nil
	}
	var paths []string
	for _, p := range found {
		paths = append(paths, p.Path)
	}
	return Pin{}, fmt.Errorf("%w: %s carried by %s", ErrAmbiguous, addrList(ips), strings.Join(paths, " and "))
}

func addrList(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
