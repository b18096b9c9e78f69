// Package install puts nftredir-cni on a node: it copies the plugin binary
// and nftredir-cni-helper beside it into the host's CNI binary
// directories and chains the plugin's entry into the network
// configuration the runtime uses, keeps them there while the primary CNI
// rewrites its file, and takes them away on uninstall.
//
// The entry is inserted into the primary conflist itself rather than left
// as a drop-in (/etc/cni/net.d/<network>/*.conf), because runtimes built on
// libcni < 1.3 (Debian bookworm's podman 4.3 and containerd 1.6 among them)
// ignore drop-ins silently, and their pods would start uncaptured.
package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
	"github.com/nftredir/nftredir/internal/durable"
)

// Config says where the plugin goes and what its entry is.
type Config struct {
	// BinDirs are the host's CNI binary directories; the plugin is copied
	// into each that exists. /opt/cni/bin is upstream's default, Debian's
	// plugins and containerd package use /usr/lib/cni.
	BinDirs []string
	// ConfDir is the runtime's configuration directory.
	ConfDir string
	// ConfName picks the network file in ConfDir; empty takes the first
	// configuration file in lexical order, the one the runtimes use.
	ConfName string
	// Entry is the plugin's entry of the chain: a JSON object with "type"
	// nftredir-cni and no "cniVersion" (a conflist's plugins take the
	// list's version).
	Entry json.RawMessage
	// Source is the plugin binary copied; empty is nftredir-cni beside
	// the running executable (nftredir-cni-helper, in the image).
	Source string
	// HelperSource is the helper binary copied beside the plugin, which
	// the plugin runs when the daemon cannot answer; empty is the running
	// executable.
	HelperSource string
	// Supported are the CNI versions the plugin speaks. A network of
	// another version is refused, since every ADD there would fail.
	Supported []string
	// ReadyFile, when set, exists exactly while the plugin is installed,
	// for probes of another process.
	ReadyFile string
	// BackupDir, when set, keeps each network file as it was before the
	// entry was first inserted, so that an uninstall puts back the very
	// bytes the primary CNI wrote (if nothing else changed in between)
	// rather than a re-encoding of them. Keep it on the host, beside the
	// ready file.
	BackupDir string
	// Kubeconfig, in Kubernetes mode, is the kubeconfig the plugin reads
	// pods with when the daemon cannot answer; nil in standalone mode.
	Kubeconfig *Kubeconfig
	// NRIGateFile, when set (NRI enrolment, docs/nri.md), is the file
	// nftredird writes once it has registered with a runtime whose NRI
	// validator holds pods back while it is away. While it exists the
	// plugin is taken out of every network instead of chained: the runtime
	// hands pods to the daemon itself, and no pod pays an exec. Until then
	// the plugin stays chained, so a node switching doors never has
	// neither.
	NRIGateFile string
	Logger      hclog.Logger
}

func (c *Config) check() error {
	var errs []error
	if len(c.BinDirs) == 0 {
		errs = append(errs, errors.New("no CNI binary directory"))
	}
	for _, d := range append(append([]string(nil), c.BinDirs...), c.ConfDir) {
		if !filepath.IsAbs(d) {
			errs = append(errs, fmt.Errorf("%q is not an absolute path", d))
		}
	}
	if c.ConfName != "" && (filepath.Base(c.ConfName) != c.ConfName || c.ConfName == "." || c.ConfName == "..") {
		errs = append(errs, fmt.Errorf("--cni-conf-name %q must be a file name in the configuration directory", c.ConfName))
	}
	if c.BackupDir != "" && !filepath.IsAbs(c.BackupDir) {
		errs = append(errs, fmt.Errorf("backup dir %q is not an absolute path", c.BackupDir))
	}
	if c.ReadyFile != "" && !filepath.IsAbs(c.ReadyFile) {
		errs = append(errs, fmt.Errorf("ready file %q is not an absolute path", c.ReadyFile))
	}
	if c.NRIGateFile != "" && !filepath.IsAbs(c.NRIGateFile) {
		errs = append(errs, fmt.Errorf("NRI gate file %q is not an absolute path", c.NRIGateFile))
	}
	if c.Kubeconfig != nil {
		if err := c.Kubeconfig.check(); err != nil {
			errs = append(errs, err)
		}
	}
	var e map[string]json.RawMessage
	if err := json.Unmarshal(c.Entry, &e); err != nil || e == nil {
		errs = append(errs, fmt.Errorf("the plugin entry is not a JSON object: %v", err))
	} else {
		if pluginType(c.Entry) != PluginType {
			errs = append(errs, fmt.Errorf("the plugin entry's type must be %q", PluginType))
		}
		if _, ok := e["cniVersion"]; ok {
			errs = append(errs, errors.New("the plugin entry must not carry cniVersion: it takes the conflist's"))
		}
	}
	return errors.Join(errs...)
}

// Installer keeps the plugin installed. Its methods are safe to call from
// several goroutines: one sync runs at a time.
type Installer struct {
	cfg Config
	log hclog.Logger
	mu  sync.Mutex // serialises syncs and uninstall
	// ready is true after a sync that left everything in place.
	ready atomic.Bool
}

// New checks cfg and returns an Installer that has changed nothing yet.
func New(cfg Config) (*Installer, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.HelperSource == "" {
		cfg.HelperSource = "/proc/self/exe"
	}
	if cfg.Source == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find the plugin binary beside this one: %w", err)
		}
		cfg.Source = filepath.Join(filepath.Dir(self), PluginType)
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	// The entry is stored compact, so what is written is stable.
	var buf bytes.Buffer
	if err := json.Compact(&buf, cfg.Entry); err != nil {
		return nil, err
	}
	cfg.Entry = buf.Bytes()
	return &Installer{cfg: cfg, log: cfg.Logger}, nil
}

// Ready reports whether the last sync found or left the binaries in every
// existing bin dir and the entry in the primary network.
func (in *Installer) Ready() bool { return in.ready.Load() }

// Sync installs what is missing and repairs what differs; it changes
// nothing when all is in place, so the watcher's own writes end in a
// no-op rather than a loop.
func (in *Installer) Sync() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	// The kubeconfig first, so that an entry naming it finds it; but a
	// kubeconfig that cannot be written does not keep the entry out: the
	// plugin then only cannot decide without the daemon, and waits.
	kerr := in.syncKubeconfig()
	err := in.syncBinaries()
	switch {
	case err != nil:
	case in.cfg.nriGated():
		err = in.unchainAll("the runtime's NRI hands pods to nftredird")
	default:
		err = in.syncConf()
	}
	err = errors.Join(err, kerr)
	in.setReady(err == nil)
	return err
}

func (in *Installer) setReady(ok bool) {
	was := in.ready.Swap(ok)
	if in.cfg.ReadyFile != "" {
		var err error
		if ok {
			if _, serr := os.Stat(in.cfg.ReadyFile); serr != nil {
				err = durable.WriteFile(in.cfg.ReadyFile, []byte("ready\n"))
			}
		} else {
			err = durable.Remove(in.cfg.ReadyFile)
		}
		if err != nil {
			in.log.Warn("cannot update the ready file", "file", in.cfg.ReadyFile, "error", err)
		}
	}
	if was != ok {
		in.log.Info("readiness changed", "ready", ok)
	}
}

// existingBinDirs are the configured bin dirs present on the host. A
// directory no runtime uses need not exist, but one of them must.
func existingBinDirs(dirs []string) ([]string, error) {
	var out []string
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not a directory", d)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none of the CNI binary directories %v exists", dirs)
	}
	return out, nil
}

// binary is a file copied into each bin dir.
type binary struct{ name, source string }

// binaries are the helper and the plugin, in the order they are
// copied: a plugin the runtime can run finds its helper beside it.
func (c *Config) binaries() []binary {
	return []binary{{helper.Name, c.HelperSource}, {PluginType, c.Source}}
}

func (in *Installer) syncBinaries() error {
	dirs, err := existingBinDirs(in.cfg.BinDirs)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		for _, b := range in.cfg.binaries() {
			if err := in.syncBinary(d, b.name, b.source); err != nil {
				return err
			}
		}
	}
	return nil
}

func (in *Installer) syncBinary(dir, name, source string) error {
	dst := filepath.Join(dir, name)
	same, err := sameFile(source, dst)
	if err != nil || same {
		return err
	}
	src, err := os.Open(source)
	if err != nil {
		return fmt.Errorf("read the %s binary: %w", name, err)
	}
	defer src.Close()
	if err := writeAtomic(dst, src, 0o755); err != nil {
		return fmt.Errorf("install %s into %s: %w", name, dir, err)
	}
	in.log.Info("binary installed", "path", dst)
	return nil
}

// sameFile reports whether dst is an executable copy of src, comparing
// in chunks: the binary is tens of MiB and the installer's memory small.
func sameFile(src, dst string) (bool, error) {
	di, err := os.Stat(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	si, err := os.Stat(src)
	if err != nil {
		return false, fmt.Errorf("read the binary to install: %w", err)
	}
	if !di.Mode().IsRegular() || di.Mode().Perm() != 0o755 || di.Size() != si.Size() {
		return false, nil
	}
	a, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("read the binary to install: %w", err)
	}
	defer a.Close()
	b, err := os.Open(dst)
	if err != nil {
		return false, err
	}
	defer b.Close()
	bufA, bufB := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		n, errA := io.ReadFull(a, bufA)
		m, errB := io.ReadFull(b, bufB)
		if n != m || !bytes.Equal(bufA[:n], bufB[:m]) {
			return false, nil
		}
		if errA == io.EOF || errA == io.ErrUnexpectedEOF {
			return errB == io.EOF || errB == io.ErrUnexpectedEOF, nil
		}
		if errA != nil {
			return false, errA
		}
		if errB != nil {
			return false, nil
		}
	}
}

// primaryConf reads the network the plugin is chained into (name, or the
// first file as libcni picks it) and refuses one whose cniVersion the
// plugin does not speak; with no supported list any version passes.
func primaryConf(dir, name string, supported []string) (string, *netConf, string, error) {
	path, err := primaryFile(dir, name)
	if err != nil {
		return "", nil, "", err
	}
	c, err := readConf(path)
	if err != nil {
		return "", nil, "", err
	}
	v, err := c.version()
	if err != nil {
		return "", nil, "", err
	}
	if len(supported) > 0 {
		if err := checkVersion(path, v, supported); err != nil {
			return "", nil, "", err
		}
	}
	return path, c, v, nil
}

func (in *Installer) syncConf() error {
	if err := os.MkdirAll(in.cfg.ConfDir, 0o755); err != nil {
		return err
	}
	path, c, v, err := primaryConf(in.cfg.ConfDir, in.cfg.ConfName, in.cfg.Supported)
	if err != nil {
		return err
	}
	if !c.single && len(c.plugins) == 0 {
		return fmt.Errorf("%s chains no plugin; %s needs one before it that gives the pod its network", path, PluginType)
	}
	// See multus.go: with Multus first, the entry goes after Multus and
	// nowhere else on the pod's path.
	multus := c.multus()
	delegatesChanged := false
	if multus {
		if delegatesChanged, err = c.withoutDelegateEntries(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	top, changed := c.withEntry(in.cfg.Entry)
	target := path
	if changed || delegatesChanged {
		data, err := render(top)
		if err != nil {
			return err
		}
		if !c.single && !c.hasAny() {
			// The primary CNI's own bytes, before anything of ours.
			in.backup(path, c.raw)
		}
		if c.single && filepath.Ext(path) == ".conf" {
			// Same name with "list" appended: it sorts right after the .conf,
			// so it is first once the .conf is gone.
			target = path + "list"
		}
		if err := writeAtomic(target, bytes.NewReader(data), c.mode); err != nil {
			return err
		}
		if target != path {
			if err := durable.Remove(path); err != nil {
				return err
			}
			in.log.Info("single-plugin network converted to a plugin list", "from", path, "to", target)
		}
		if delegatesChanged {
			in.log.Info("plugin removed from Multus' delegates: it runs once, after Multus", "file", target)
		}
		in.log.Info("plugin chained into the network", "file", target, "cni_version", v, "multus", multus)
	}
	if multus {
		return in.unchainDelegated(target)
	}
	return nil
}

// unchainDelegated removes the plugin's entry from every network file but
// the Multus primary: Multus may run any of them as its cluster network,
// and the plugin would then run twice for one sandbox.
func (in *Installer) unchainDelegated(primary string) error {
	others, err := otherNetworks(in.cfg.ConfDir, primary)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range others {
		top, changed := o.withoutEntry()
		if !changed {
			continue
		}
		data, err := render(top)
		if err == nil {
			err = writeAtomic(o.path, bytes.NewReader(data), o.mode)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		in.log.Info("plugin removed from a network Multus may delegate to: it runs once, after Multus", "file", o.path, "multus", primary)
	}
	return errors.Join(errs...)
}

// nriGated reports whether the node's gate is the runtime's NRI
// validator (NRIGateFile exists), so the plugin must not be chained.
func (c *Config) nriGated() bool {
	if c.NRIGateFile == "" {
		return false
	}
	_, err := os.Stat(c.NRIGateFile)
	return err == nil
}

// Uninstall removes the plugin's entry from every network in the
// configuration directory, then the binaries from every bin dir: a network
// still naming a deleted binary would fail each ADD. Missing pieces are
// fine, so it can be repeated.
func (in *Installer) Uninstall() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.setReady(false)
	var errs []error
	if err := in.unchainAll("uninstall"); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 && in.cfg.BackupDir != "" {
		if err := os.RemoveAll(in.cfg.BackupDir); err != nil {
			errs = append(errs, err)
		}
	}
	// The binaries go only once no network names the plugin.
	if len(errs) == 0 {
		if k := in.cfg.Kubeconfig; k != nil {
			if err := durable.Remove(k.Path); err != nil {
				errs = append(errs, err)
			}
		}
		for _, d := range in.cfg.BinDirs {
			for _, b := range in.cfg.binaries() {
				p := filepath.Join(d, b.name)
				if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err := durable.Remove(p); err != nil {
					errs = append(errs, err)
					continue
				}
				in.log.Info("binary removed", "path", p)
			}
		}
	}
	return errors.Join(errs...)
}

// unchainAll removes the plugin's entry from every network in the
// configuration directory, putting back the primary CNI's own bytes where
// nothing else changed; why is logged with each file.
func (in *Installer) unchainAll(why string) error {
	var errs []error
	files, err := confFiles(in.cfg.ConfDir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range files {
		c, err := readConf(f)
		if err != nil {
			// Not ours to repair; it cannot chain us in a form we know.
			in.log.Warn("skipping an unreadable network file", "file", f, "error", err)
			continue
		}
		top, changed := c.withoutEntry()
		if !changed {
			continue
		}
		data, err := render(top)
		if orig := in.original(f); err == nil && orig != nil && sameJSON(orig, data) {
			data = orig
		}
		if err == nil {
			err = writeAtomic(f, bytes.NewReader(data), c.mode)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		in.log.Info("plugin removed from the network", "file", f, "why", why)
	}
	return errors.Join(errs...)
}

// backup keeps raw as path's original; a failure costs only byte-exactness
// at uninstall, so it is logged, not returned.
func (in *Installer) backup(path string, raw []byte) {
	if in.cfg.BackupDir == "" {
		return
	}
	err := os.MkdirAll(in.cfg.BackupDir, 0o700)
	if err == nil {
		err = durable.WriteFile(filepath.Join(in.cfg.BackupDir, filepath.Base(path)), raw)
	}
	if err != nil {
		in.log.Warn("cannot keep the network file's original; an uninstall will re-encode it", "file", path, "error", err)
	}
}

// original is path's backup, or nil.
func (in *Installer) original(path string) []byte {
	if in.cfg.BackupDir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(in.cfg.BackupDir, filepath.Base(path)))
	if err != nil {
		return nil
	}
	return b
}

// Check reports, changing nothing, whether the plugin is installed as cfg
// says: the binaries in every existing bin dir and the entry in the primary
// network (any nftredir-cni entry when cfg.Entry is empty). It is for a
// process other than the installer, such as a readiness probe.
func Check(cfg Config) error {
	dirs, err := existingBinDirs(cfg.BinDirs)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		for _, b := range cfg.binaries() {
			p := filepath.Join(d, b.name)
			fi, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("%s binary: %w", b.name, err)
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
				return fmt.Errorf("%s binary %s is not an executable file", b.name, p)
			}
		}
	}
	if k := cfg.Kubeconfig; k != nil {
		if _, err := os.Stat(k.Path); err != nil {
			return fmt.Errorf("plugin kubeconfig: %w", err)
		}
	}
	if cfg.nriGated() {
		return checkUnchained(cfg.ConfDir)
	}
	path, c, _, err := primaryConf(cfg.ConfDir, cfg.ConfName, cfg.Supported)
	if err != nil {
		return err
	}
	if len(cfg.Entry) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, cfg.Entry); err != nil {
			return err
		}
		if !c.hasEntry(buf.Bytes()) {
			return fmt.Errorf("%s does not chain %s as configured", path, PluginType)
		}
	} else if !slices.ContainsFunc(c.plugins, func(p json.RawMessage) bool { return pluginType(p) == PluginType }) {
		return fmt.Errorf("%s does not chain %s", path, PluginType)
	}
	if c.multus() {
		twice, err := delegatedEntries(cfg.ConfDir, c)
		if err != nil {
			return err
		}
		if len(twice) > 0 {
			return fmt.Errorf("%s is Multus and chains %s, which %s chain(s) too: it would run twice for each pod", path, PluginType, strings.Join(twice, ", "))
		}
	}
	return nil
}

// checkUnchained reports a network of dir that still chains the plugin,
// which the runtime's NRI made redundant.
func checkUnchained(dir string) error {
	files, err := confFiles(dir)
	if err != nil {
		return err
	}
	for _, f := range files {
		c, err := readConf(f)
		if err != nil {
			continue
		}
		if _, chained := c.withoutEntry(); chained {
			return fmt.Errorf("%s still chains %s although the runtime's NRI hands pods to nftredird", f, PluginType)
		}
	}
	return nil
}

// writeAtomic replaces path so that a reader (a runtime executing the
// plugin, or loading the network) sees the old file or the new one, never
// a part: write a temporary file in the same directory, fsync, rename.
// The temporary name has no configuration extension and is not the
// plugin's name, so no runtime picks it up.
func writeAtomic(path string, data io.Reader, mode fs.FileMode) error {
	return durable.WriteFrom(path, data, mode)
}
