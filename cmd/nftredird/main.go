// Command nftredird is the nftredir node daemon. See --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stderr))
}

// run returns the exit code: 0 after a clean stop, 1 when the daemon
// could not start or failed, 2 for invalid flags.
func run(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) int {
	opts, err := parseFlags(args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nftredird: %v\nRun nftredird --help for the flags.\n", err)
		return 2
	}
	root := hclog.New(&hclog.LoggerOptions{
		Name:       "nftredird",
		Level:      opts.level,
		JSONFormat: opts.logFormat == "json",
		Output:     stderr,
		TimeFormat: time.RFC3339Nano,
	})
	if err := serve(opts, root); err != nil {
		root.Error("exiting", "error", err)
		return 1
	}
	root.Info("stopped")
	return 0
}

func serve(opts *options, root hclog.Logger) error {
	guard, err := netns.NewGuard(opts.protectNetns...)
	if err != nil {
		return fmt.Errorf("namespace guard: %w", err)
	}
	defaults := opts.spec
	srv, err := server.New(server.Config{
		Guard:             guard,
		Applier:           nft.NewNetlink(),
		StateDir:          opts.stateDir,
		Routing:           opts.routing,
		Defaults:          &defaults,
		Logger:            root.Named("server"),
		AllowUIDs:         opts.allowUIDs,
		AllowGIDs:         opts.allowGIDs,
		ReconcileInterval: opts.reconcileInterval,
		Reflection:        opts.reflection,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	lis, err := listenSocket(opts.socket, opts.socketGroup, root)
	if err != nil {
		return err
	}
	defer func() {
		// The listener unlinks on close too; this covers a listener
		// that never got closed by the gRPC server.
		if err := os.Remove(opts.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			root.Warn("cannot remove the socket", "socket", opts.socket, "error", err)
		}
	}()
	root.Info("listening", "socket", opts.socket, "state_dir", opts.stateDir, "allow_uids", opts.allowUIDs.String(), "allow_gids", opts.allowGIDs.String(), "socket_group", opts.socketGroup)
	return srv.Run(ctx, lis, opts.shutdownTimeout)
}
