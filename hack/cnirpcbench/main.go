// Command cnirpcbench times nftredir-cni's ADD as a runtime runs it (exec,
// connect, AddPod, exit) for several builds of the plugin, interleaved in
// one run, and prints each build's figures as ratios to the first's. It is
// how the plugin's choice of RPC client was made (see
// cmd/nftredir-cni/internal/rpc/README.md); build.sh makes the builds.
//
// Run as root. It creates network namespaces named nftr-rpcb-<pid>-*,
// starts nftredird in one of them as the node (so the machine's own
// namespace is never programmed), and removes all of it at the end, on
// error and on Ctrl-C.
//
// Each round gives every build a fresh pod namespace and times its ADD
// enrolling it and its DEL releasing it (RemovePod with namespace_teardown);
// the namespace is then deleted, untimed, with a pause for the kernel's
// cleanup of it. Each round also
// times every build's ADD of a pod whose Kubernetes namespace the entry
// excludes: the same exec, config and result, without the daemon, which
// is what the client's linking and initialisation cost alone. The order
// of the builds rotates from round to round.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/testkit/signtest"
)

type build struct {
	name, bin      string
	add, del, excl []sample
}

type sample struct{ wall, cpu time.Duration }

func main() {
	var (
		daemon = flag.String("daemon", "bin/nftredird", "nftredird binary")
		rounds = flag.Int("n", 60, "rounds")
		pause  = flag.Duration("pause", 100*time.Millisecond, "pause after each namespace deletion")
	)
	var builds []*build
	flag.Func("build", "`NAME=PATH` of an nftredir-cni build; repeat; the first is the baseline", func(s string) error {
		name, path, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("want NAME=PATH, got %q", s)
		}
		abs, err := filepath.Abs(path)
		builds = append(builds, &build{name: name, bin: abs})
		return err
	})
	flag.Parse()
	if len(builds) == 0 {
		fmt.Fprintln(os.Stderr, "cnirpcbench: give at least one -build NAME=PATH")
		os.Exit(2)
	}
	if err := run(builds, *daemon, *rounds, *pause); err != nil {
		fmt.Fprintln(os.Stderr, "cnirpcbench:", err)
		os.Exit(1)
	}
}

type world struct {
	prefix  string
	dir     string
	socket  string
	netns   []string
	daemon  *exec.Cmd
	counter int
}

func (w *world) newNetns() (string, error) {
	w.counter++
	name := fmt.Sprintf("%s-%d", w.prefix, w.counter)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	w.netns = append(w.netns, name)
	// The pod's loopback up, as the runtime's loopback plugin leaves it.
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return "", fmt.Errorf("lo up in %s: %v: %s", name, err, out)
	}
	return name, nil
}

func (w *world) delNetns(name string) {
	_ = exec.Command("ip", "netns", "del", name).Run()
	w.netns = slices.DeleteFunc(w.netns, func(n string) bool { return n == name })
}

func (w *world) close() {
	if w.daemon != nil && w.daemon.Process != nil {
		_ = w.daemon.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = w.daemon.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = w.daemon.Process.Kill()
			<-done
		}
	}
	for _, n := range slices.Clone(w.netns) {
		w.delNetns(n)
	}
	if w.dir != "" {
		_ = os.RemoveAll(w.dir)
	}
}

func run(builds []*build, daemon string, rounds int, pause time.Duration) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: it creates network namespaces and starts nftredird")
	}
	daemon, err := filepath.Abs(daemon)
	if err != nil {
		return err
	}
	w := &world{prefix: fmt.Sprintf("nftr-rpcb-%d", os.Getpid())}
	defer w.close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		w.close()
		os.Exit(130)
	}()

	// Records on the root filesystem, as /var/lib is on a node.
	if w.dir, err = os.MkdirTemp("/var/tmp", w.prefix+"-"); err != nil {
		return err
	}
	w.socket = filepath.Join(w.dir, "nftredir.sock")
	node, err := w.newNetns()
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(w.dir, "nftredird.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	w.daemon = exec.Command("nsenter", "--net=/run/netns/"+node, "--", daemon,
		"--socket", w.socket, "--state-dir", filepath.Join(w.dir, "state"), "--log-level", "warn",
		"--probe-snat=false", "--zds-socket=", "--metrics-address=")
	w.daemon.Stdout, w.daemon.Stderr = logf, logf
	w.daemon.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.daemon.Start(); err != nil {
		return err
	}
	cl, err := client.Dial(context.Background(), w.socket)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := waitServing(cl); err != nil {
		return err
	}

	for r := range rounds {
		order := slices.Clone(builds)
		k := r % len(order)
		order = append(order[k:], order[:k]...)
		for _, b := range order {
			s, err := w.exec(b, "ADD", "excluded", "", r)
			if err != nil {
				return err
			}
			b.excl = append(b.excl, s)
		}
		for _, b := range order {
			ns, err := w.newNetns()
			if err != nil {
				return err
			}
			s, err := w.exec(b, "ADD", "", ns, r)
			if err != nil {
				return err
			}
			b.add = append(b.add, s)
			if s, err = w.exec(b, "DEL", "", ns, r); err != nil {
				return err
			}
			b.del = append(b.del, s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = cl.GetPod(ctx, uid(b, r))
			cancel()
			if status.Code(err) != codes.NotFound {
				return fmt.Errorf("%s DEL left pod %s enrolled (%v)", b.name, uid(b, r), err)
			}
			w.delNetns(ns)
			time.Sleep(pause)
		}
	}
	report(builds, rounds)
	return nil
}

func waitServing(cl *client.Client) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		h, err := cl.Health(ctx)
		cancel()
		if err == nil && h.Serving() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nftredird not serving after 15s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func uid(b *build, round int) string { return fmt.Sprintf("rpcb-%s-%d", b.name, round) }

// exec runs one command of build b: on pod namespace ns, or, with k8sNS
// "excluded", for a pod the entry excludes.
func (w *world) exec(b *build, command, k8sNS, ns string, round int) (sample, error) {
	netnsPath := "/run/netns/" + ns
	if ns == "" {
		netnsPath = "/run/netns/" + w.prefix + "-absent"
	}
	if k8sNS == "" {
		k8sNS = "bench"
	}
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": "rpcbench", "type": "nftredir-cni",
		"socket": w.socket, "dataDir": filepath.Join(w.dir, "data-"+b.name),
		"excludeNamespaces": []string{"excluded"},
		"prevResult": map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": netnsPath}},
			"ips":        []any{map[string]any{"address": "10.250.0.2/24", "interface": 0}},
		},
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		return sample{}, err
	}
	cmd := exec.Command(b.bin)
	cmd.Env = []string{
		"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + uid(b, round), "CNI_NETNS=" + netnsPath, "CNI_IFNAME=eth0",
		"CNI_PATH=" + filepath.Dir(b.bin),
		fmt.Sprintf("CNI_ARGS=K8S_POD_NAMESPACE=%s;K8S_POD_NAME=web-%d;K8S_POD_UID=%s", k8sNS, round, uid(b, round)),
	}
	cmd.Stdin = strings.NewReader(string(stdin))
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err = cmd.Run()
	wall := time.Since(t0)
	if err != nil {
		return sample{}, fmt.Errorf("%s %s: %v: %s%s", b.name, command, err, out.String(), errb.String())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return sample{wall: wall, cpu: cpu}, nil
}

func median(d []float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func pick(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func report(builds []*build, rounds int) {
	base := builds[0]
	fmt.Printf("nftredir-cni exec, %d rounds, builds interleaved; p50 ms, and median [min–max] of per-round ratios to %s\n\n", rounds, base.name)
	fmt.Println("| build | binary MiB | ADD ms | ADD vs " + base.name + " | DEL ms | DEL vs " + base.name + " | ADD+DEL ms | ADD+DEL vs " + base.name + " | ADD cpu ms | excluded ADD ms | excluded vs " + base.name + " |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	addDel := func(b *build, i int) float64 { return ms(b.add[i].wall) + ms(b.del[i].wall) }
	for _, b := range builds {
		st, _ := os.Stat(b.bin)
		cell := func(f func(b *build, i int) float64) string {
			var vs, rs []float64
			for i := range rounds {
				vs = append(vs, f(b, i))
				rs = append(rs, f(b, i)/f(base, i))
			}
			return fmt.Sprintf("%.2f | %.3f× [%.3f–%.3f]", median(vs), median(rs), slices.Min(rs), slices.Max(rs))
		}
		wall := func(get func(*build) []sample) func(*build, int) float64 {
			return func(b *build, i int) float64 { return ms(get(b)[i].wall) }
		}
		cpu := pick(b.add, func(s sample) float64 { return ms(s.cpu) })
		fmt.Printf("| %s | %.1f | %s | %s | %s | %.2f | %s |\n", b.name, float64(st.Size())/(1<<20),
			cell(wall(func(b *build) []sample { return b.add })), cell(wall(func(b *build) []sample { return b.del })),
			cell(addDel), median(cpu), cell(wall(func(b *build) []sample { return b.excl })))
	}
	// The differences a pod pays, round by round, and whether the run
	// tells them from noise: each round's two execs of a build ran next
	// to the baseline's, so the machine's drift weighs on both.
	fmt.Printf("\nPer round, each build minus %s (ms): median [min–max], rounds above / below, and the sign test's chance of that split between equal builds (below %.2g: resolved)\n\n", base.name, signtest.Significance)
	fmt.Println("| build | ADD+DEL wall | above / below | chance | ADD+DEL CPU | above / below | chance |")
	fmt.Println("|---|---|---|---|---|---|---|")
	cpuAddDel := func(b *build, i int) float64 { return ms(b.add[i].cpu) + ms(b.del[i].cpu) }
	for _, b := range builds[1:] {
		diff := func(f func(*build, int) float64) string {
			var ds []float64
			for i := range rounds {
				ds = append(ds, f(b, i)-f(base, i))
			}
			above, below := signtest.Count(ds)
			return fmt.Sprintf("%+.2f [%+.2f – %+.2f] | %d / %d | %.2g", median(ds), slices.Min(ds), slices.Max(ds), above, below, signtest.Chance(above, below))
		}
		fmt.Printf("| %s | %s | %s |\n", b.name, diff(addDel), diff(cpuAddDel))
	}
}
