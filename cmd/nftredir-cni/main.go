// Command nftredir-cni is a chained CNI plugin that enrols each pod with
// nftredird, so that the pod's TCP is captured by the node proxy from the
// moment its sandbox exists. See docs/cni.md.
//
// "nftredir-cni install" and "nftredir-cni uninstall" put the plugin on a
// node and take it away. Runtimes execute plugins with no arguments, so a
// first argument never comes from a CNI call.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/install"
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
	if len(os.Args) > 1 && (os.Args[1] == install.CmdInstall || os.Args[1] == install.CmdUninstall) {
		os.Exit(install.Main(os.Args[1], os.Args[2:], os.LookupEnv, plugin.Versions.SupportedVersions(), os.Stderr))
	}
	about := "nftredir-cni: enrols pods with nftredird (chained CNI plugin) " + version.Get().String()
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.Versions, about)
}
