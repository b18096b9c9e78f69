// Command nftredir-cni is a chained CNI plugin that enrols each pod with
// nftredird, so that the pod's TCP is captured by the node proxy from the
// moment its sandbox exists. See docs/cni.md.
package main

import (
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/plugin"
)

func main() {
	about := "nftredir-cni: enrols pods with nftredird (chained CNI plugin)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		about += " " + bi.Main.Version
	}
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.Versions, about)
}
