// Command nftredir-cni-helper is the part of nftredir-cni that the
// runtime does not exec for every pod: "install" and "uninstall" put the
// plugin on a node and take it away, and "lookup" reads from the
// Kubernetes API, for the plugin, whether the enrolment policy captures a
// pod when nftredird cannot answer (internal/helper,
// docs/blast-radius.md). What these need (an HTTPS client, a file
// watcher) would slow every pod start if it were linked into the plugin.
//
// "nftredir-cni install" and "nftredir-cni uninstall" hand over to this
// program, so either name works.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/install"
	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/plugin"
	"github.com/nftredir/nftredir/internal/kubelookup"
	"github.com/nftredir/nftredir/internal/version"
)

const usage = `usage: nftredir-cni-helper install [flags] | uninstall [flags] | lookup | --version

  install, uninstall   put nftredir-cni on this node, or take it away
                       (--help lists their flags)
  lookup               nftredir-cni's Kubernetes API lookup: a JSON
                       request on stdin, the decision on stdout
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch cmd := os.Args[1]; cmd {
	case "--version", "-version":
		version.Print(os.Stdout, helper.Name)
	case helper.Install, helper.Uninstall:
		os.Exit(install.Main(cmd, os.Args[2:], os.LookupEnv, plugin.Versions.SupportedVersions(), os.Stderr))
	case helper.Lookup:
		if err := helper.Serve(os.Stdin, os.Stdout, decide); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "nftredir-cni-helper: unknown command %q\n%s", cmd, usage)
		os.Exit(2)
	}
}

func decide(ctx context.Context, req helper.Request) (helper.Decision, error) {
	c, err := kubelookup.Load(req.Kubeconfig)
	if err != nil {
		return helper.Decision{}, err
	}
	defer c.Close()
	d, err := c.Decide(ctx, req.Selector, req.Namespace, req.Name, req.UID)
	return helper.Decision{Captured: d.Captured, Why: d.Why}, err
}
