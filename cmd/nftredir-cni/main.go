// Command nftredir-cni is a chained CNI plugin that enrols each pod with
// nftredird, so that the pod's TCP is captured by the node proxy from the
// moment its sandbox exists. See docs/cni.md.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"

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
	about := "nftredir-cni: enrols pods with nftredird (chained CNI plugin) " + version.Get().String()
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.Versions, about)
}
