// Command nftredir-cni is a chained CNI plugin that enrols each pod with
// nftredird, so that the pod's TCP is captured by the node proxy from the
// moment its sandbox exists. See docs/cni.md.
//
// The runtime execs it for every pod, so it links only what a CNI call
// needs. "nftredir-cni install" and "nftredir-cni uninstall" hand over to
// nftredir-cni-helper beside it, which holds the rest. Runtimes execute
// plugins with no arguments, so a first argument never comes from a CNI
// call.
package main

import (
	"fmt"
	"os"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/helper"
	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/plugin"
	"github.com/nftredir/nftredir/internal/version"
)

func main() {
	// A runtime calls the plugin with no arguments and CNI_COMMAND set
	// (VERSION included); an argument is a person asking.
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		version.Print(os.Stdout, "nftredir-cni")
		return
	}
	if len(os.Args) > 1 && (os.Args[1] == helper.Install || os.Args[1] == helper.Uninstall) {
		handOver()
	}
	about := "nftredir-cni: enrols pods with nftredird (chained CNI plugin) " + version.Get().String()
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.Versions, about)
}

// handOver replaces this process with the helper, same arguments and
// environment: the installer's container keeps its PID and its signals.
func handOver() {
	path, err := helper.Beside()
	if err == nil {
		err = syscall.Exec(path, append([]string{path}, os.Args[1:]...), os.Environ())
	}
	fmt.Fprintf(os.Stderr, "nftredir-cni %s: run %s: %v\n", os.Args[1], helper.Name, err)
	os.Exit(2)
}
