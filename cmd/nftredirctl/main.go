// Command nftredirctl is the operator's CLI for nftredird: it enrols and
// releases pods, shows what is enrolled and whether the rules are intact,
// follows changes, and checks the daemon's health.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/internal/version"
)

// Exit codes, as documented in the usage text.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// defaultWait is generous for one netlink batch and a file write, yet short
// enough that a hung daemon does not hang a script.
const defaultWait = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &app{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, now: time.Now}
	os.Exit(a.run(ctx, os.Args[1:]))
}

// app is one invocation; its fields are the process's surroundings, so tests
// can run the CLI as a function.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time

	socket  string
	timeout time.Duration
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	// args is the synopsis after the command name.
	args string
	// help is the body of `nftredirctl <name> --help`, examples included.
	help string
	// flags registers the command's own flags and returns what runs it with
	// the positional arguments.
	flags func(a *app, fs *flag.FlagSet) func(ctx context.Context, c *client.Client, args []string) error
	// local: the command does not talk to the daemon; it runs with a nil
	// client.
	local bool
}

// usageError is a mistake in the command line: exit 2, with a pointer to
// --help, and no call made.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

var commands = []*command{addCmd, removeCmd, getCmd, listCmd, watchCmd, healthCmd, doctorCmd}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (a *app) run(ctx context.Context, args []string) int {
	a.socket = client.DefaultSocket
	if s := a.getenv("NFTREDIR_SOCKET"); s != "" {
		a.socket = s
	}
	a.timeout = defaultWait

	global := a.newFlagSet("nftredirctl")
	showVersion := global.Bool("version", false, "print the version and exit")
	args, err := parse(global, args, true)
	if errors.Is(err, flag.ErrHelp) {
		a.usage(a.stdout)
		return exitOK
	}
	if err != nil {
		return a.usageFailed("", err)
	}
	if *showVersion {
		version.Print(a.stdout, "nftredirctl")
		return exitOK
	}
	if len(args) == 0 {
		a.usage(a.stderr)
		return exitUsage
	}
	name, args := args[0], args[1:]
	if name == "help" {
		if len(args) == 0 {
			a.usage(a.stdout)
			return exitOK
		}
		name, args = args[0], []string{"--help"}
	}
	cmd := lookup(name)
	if cmd == nil {
		return a.usageFailed("", usagef("unknown command %q", name))
	}

	fs := a.newFlagSet("nftredirctl " + cmd.name)
	do := cmd.flags(a, fs)
	args, err = parse(fs, args, false)
	if errors.Is(err, flag.ErrHelp) {
		a.commandUsage(a.stdout, cmd, fs)
		return exitOK
	}
	if err != nil {
		return a.usageFailed(cmd.name, err)
	}

	var c *client.Client
	if !cmd.local {
		c, err = client.Dial(ctx, a.socket, client.WithTimeout(a.timeout))
		if err != nil {
			return a.usageFailed(cmd.name, usagef("--socket: %v", err))
		}
		defer func() { _ = c.Close() }()
	}
	err = do(ctx, c, args)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return a.usageFailed(cmd.name, err)
	default:
		a.failed(cmd.name, err)
		return exitFailed
	}
}

// newFlagSet returns a flag set that reports rather than prints, and that
// takes the global flags too, so that they may follow the command.
func (a *app) newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&a.socket, "socket", a.socket,
		"the daemon's Unix socket `PATH` (environment NFTREDIR_SOCKET)")
	fs.DurationVar(&a.timeout, "timeout", a.timeout,
		"give up on a call after this `DURATION`, e.g. 500ms, 30s; 0 waits forever")
	return fs
}

// parse parses flags wherever they appear among the arguments, so that
// `get UID -o json` works as well as `get -o json UID`. With stopAtArg the
// first positional argument ends parsing: it is the command name, and what
// follows belongs to the command.
func parse(fs *flag.FlagSet, args []string, stopAtArg bool) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at the first positional argument, or after a "--",
		// which it consumes; after "--" everything is positional.
		consumed := len(args) - len(rest)
		if stopAtArg || (consumed > 0 && args[consumed-1] == "--") {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func (a *app) usage(w io.Writer) {
	fmt.Fprint(w, `nftredirctl controls nftredird, the node daemon that captures pod traffic
for a node proxy (such as Istio ambient's ztunnel) with nftables rules inside
each pod's network namespace.

Usage:
  nftredirctl [--socket PATH] [--timeout DURATION] <command> [flags] [args]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `
Global flags (they may also follow the command):
  --socket PATH        the daemon's Unix socket (default %s,
                       or $NFTREDIR_SOCKET when set)
  --timeout DURATION   give up on a call after this long (default %s; 0 waits forever)
  --version            print the version (module, VCS revision, Go version) and exit

Run 'nftredirctl <command> --help' (or 'nftredirctl help <command>') for a
command's flags and examples. Talking to the daemon needs root or a uid/gid
the daemon allows.

Examples:
  nftredirctl health
  nftredirctl list
  nftredirctl add --pod-uid 0b5c8f3e-4c1d --name web-1 --namespace default \
      --netns /var/run/netns/cni-1234 --ip 10.244.1.7
  nftredirctl get 0b5c8f3e-4c1d
  nftredirctl remove 0b5c8f3e-4c1d

Exit status: 0 success; 1 the daemon refused or could not be reached (the
gRPC code and message are printed); 2 the command line is wrong.
`, client.DefaultSocket, defaultWait)
}

func (a *app) commandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "nftredirctl %s: %s\n\nUsage:\n  nftredirctl %s", cmd.name, cmd.summary, cmd.name)
	if cmd.args != "" {
		fmt.Fprintf(w, " %s", cmd.args)
	}
	fmt.Fprintf(w, "\n\n%s\n", strings.TrimSpace(cmd.help))
	own := func(name string) bool { return name != "socket" && name != "timeout" }
	hasOwn := false
	fs.VisitAll(func(f *flag.Flag) { hasOwn = hasOwn || own(f.Name) })
	if hasOwn {
		fmt.Fprintf(w, "\nFlags:\n")
		printFlags(w, fs, own)
	}
	fmt.Fprintf(w, "\nGlobal flags:\n")
	printFlags(w, fs, func(name string) bool { return name == "socket" || name == "timeout" })
}

// printFlags lists flags in the --name style the examples use, rather than
// flag.PrintDefaults's single dash, required flags first.
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(string) bool) {
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		// --output is listed with -o.
		if keep(f.Name) && f.Name != "output" {
			flags = append(flags, f)
		}
	})
	slices.SortStableFunc(flags, func(x, y *flag.Flag) int {
		rx, ry := strings.Contains(x.Usage, "(required)"), strings.Contains(y.Usage, "(required)")
		switch {
		case rx && !ry:
			return -1
		case ry && !rx:
			return 1
		}
		return 0
	})
	for _, f := range flags {
		kind, usage := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if f.Name == "o" {
			head = "  -o, --output"
		}
		if kind != "" {
			head += " " + kind
		}
		fmt.Fprintf(w, "%s\n      %s", head, usage)
		if f.DefValue != "" && f.DefValue != "[]" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	}
}

func (a *app) usageFailed(cmd string, err error) int {
	prefix, help := "nftredirctl", "nftredirctl --help"
	if cmd != "" {
		prefix, help = "nftredirctl "+cmd, "nftredirctl "+cmd+" --help"
	}
	fmt.Fprintf(a.stderr, "%s: %v\nRun '%s' for usage.\n", prefix, err, help)
	return exitUsage
}

// failed reports a call that did not succeed, as the gRPC code and message,
// with a hint for the codes an operator can act on.
func (a *app) failed(cmd string, err error) {
	st, ok := status.FromError(err)
	if !ok {
		fmt.Fprintf(a.stderr, "nftredirctl: %s failed: %v\n", cmd, err)
		return
	}
	fmt.Fprintf(a.stderr, "nftredirctl: %s failed: %s: %s\n", cmd, st.Code(), st.Message())
	switch st.Code() {
	case codes.Unavailable:
		// gRPC reports a refused connect(2) only in the message text.
		if strings.Contains(st.Message(), "permission denied") {
			fmt.Fprintf(a.stderr, "hint: the permissions of %s refuse this user; run as root, or ask for a group that may connect (nftredird --socket-group) and an allowed uid or gid (nftredird --allow-uid, --allow-gid)\n", a.socket)
			break
		}
		fmt.Fprintf(a.stderr, "hint: is nftredird running and listening on %s? (--socket, $NFTREDIR_SOCKET)\n", a.socket)
	case codes.PermissionDenied:
		fmt.Fprintln(a.stderr, "hint: run as root or as a uid/gid the daemon allows")
	case codes.DeadlineExceeded:
		fmt.Fprintln(a.stderr, "hint: the call may still take effect; check with 'nftredirctl get' or raise --timeout")
	}
}
